"""'did you mean ...?' for a name chosen from a list: a command, stage or action, an RL or model
preset, a task, a loss, an estimator. One matcher for every layer (it imports nothing of lmpo,
nor torch: `lmpo --help` and `lmpo presets` start without it); `lmpo.teach.names` says the hint
in a teaching command's language."""

from __future__ import annotations

import difflib
from typing import Iterable


def _key(name: str) -> str:
    """Case and `-`/`_` do not tell two names apart (GRPO, dr-grpo)."""
    return str(name).strip().lower().replace("-", "_")


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name nearest `name`, or None when none is near."""
    by_key = {_key(k): k for k in known}
    found = difflib.get_close_matches(_key(name), list(by_key), n=1, cutoff=0.6)
    return by_key[found[0]] if found else None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """` (did you mean 'grpo'?)` to put after the name in an error, or "" when no name is near."""
    near = closest(name, known)
    return f" (did you mean {near!r}?)" if near else ""
