"""What a directory's `run.json` says: which trainer (or the pipeline) made it, and, for a
pipeline that has not written its summary.json yet, which stage directories it holds."""

from __future__ import annotations

import json
from pathlib import Path

from lmpo.trainers.run_dir import RUN_RECORD


def trainer_of(run_dir: Path, command: bool = False) -> str | None:
    """The trainer that made `run_dir` by its run.json (with `command`, the `lmpo train` command
    that started it where recorded: a pipeline's stages record none); None: no run.json; "?": unreadable."""
    try:
        record = json.loads((run_dir / RUN_RECORD).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return "?"
    if not isinstance(record, dict):
        return "?"
    return (command and record.get("command")) or record.get("trainer") or "?"


def unfinished_pipeline_stages(run_dir: Path) -> list[Path]:
    """The stage directories of a pipeline that has no summary.json yet (interrupted, or still
    running), in the order they started (each stage writes its run.json when it starts, and a
    resumed one keeps it); [] for a finished pipeline or a directory that is no pipeline."""
    if (run_dir / "summary.json").is_file() or trainer_of(run_dir) != "pipeline":
        return []
    stages = [record.parent for record in run_dir.glob(f"*/{RUN_RECORD}")]
    return sorted(stages, key=lambda stage: ((stage / RUN_RECORD).stat().st_mtime_ns, stage.name))
