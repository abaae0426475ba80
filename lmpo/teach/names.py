"""'did you mean ...?' for a method, exercise or claim name that lmpo does not know."""

from __future__ import annotations

import difflib
from typing import Iterable

from lmpo.teach.refusals import refusal


def _key(name: str) -> str:
    """Case and `-`/`_` do not tell two names apart (GRPO, dr-grpo)."""
    return name.strip().lower().replace("-", "_")


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name nearest `name`, or None when none is near."""
    by_key = {_key(k): k for k in known}
    found = difflib.get_close_matches(_key(name), list(by_key), n=1, cutoff=0.6)
    return by_key[found[0]] if found else None


def did_you_mean(name: str, known: Iterable[str], lang: str = "en") -> str:
    """` (did you mean 'grpo'?)` (in `lang`) to put after the name in an error, or "" when no name is near."""
    near = closest(name, known)
    return refusal("did_you_mean", lang, near=near) if near else ""
