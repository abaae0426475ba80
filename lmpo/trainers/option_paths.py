"""Options that name files, compared and reused across working directories.

A run records its options as typed (`--data data/pairs.jsonl`) and the directory it started in
(`run.json`'s `cwd`). A resume from another directory reads those relative paths from where the
run started, and `--data /abs/data/pairs.jsonl` or `./data/pairs.jsonl` given with it compares
equal to what the run recorded, since each side is made absolute from its own directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

PATH_OPTIONS = ("model", "data", "prompts", "eval_prompts", "heldout_data", "ptx_data", "reward_model",
                "chat_template")
"""Options whose value may be a file or directory (a model may also be a preset or Hub name, a chat
template its text: those are left as they are, since no such path exists)."""
FILE_PART_OPTIONS = ("task", "rewards")
"""Options whose parts may start with a Python file: `--task my_task.py:Task`, `--rewards my.py:fn=0.5`."""


def started_in(run_dir: str | Path) -> str | None:
    """The working directory a run started in (`run.json`'s `cwd`; None for a run that predates it)."""
    try:
        cwd = json.loads((Path(run_dir) / "run.json").read_text()).get("cwd")
    except (OSError, ValueError, AttributeError):
        return None
    return cwd if isinstance(cwd, str) and cwd else None


def absolute_paths(options: dict, base: str | Path, file_parts: bool = True) -> dict:
    """`options` with each relative path that exists from `base` made absolute (a pipeline's
    stage sections too); anything else as it is. `file_parts=False` leaves `task` and `rewards`
    as they are: a reward's name, file included, is its metric's name (`reward_my.py:fn`)."""
    out = {}
    for key, value in options.items():
        if isinstance(value, dict):
            out[key] = absolute_paths(value, base, file_parts)
        elif key in PATH_OPTIONS and isinstance(value, str):
            out[key] = _absolute(value, base)
        elif key in FILE_PART_OPTIONS and isinstance(value, str) and file_parts:
            out[key] = ",".join(_absolute_file_part(part, base) for part in value.split(","))
        else:
            out[key] = value
    return out


def _absolute(value: str, base: str | Path) -> str:
    if not value or os.path.isabs(value) or "\n" in value:
        return value
    candidate = os.path.join(os.fspath(base), os.path.expanduser(value))
    return os.path.normpath(os.path.abspath(candidate)) if os.path.exists(candidate) else value


def _absolute_file_part(part: str, base: str | Path) -> str:
    """`my.py:fn=0.5` → `/where/my.py:fn=0.5`; a module name or a built-in name as it is."""
    file, colon, rest = part.partition(":")
    if not colon or not file.strip().endswith(".py"):
        return part
    lead = file[:len(file) - len(file.lstrip())]
    return f"{lead}{_absolute(file.strip(), base)}{colon}{rest}"
