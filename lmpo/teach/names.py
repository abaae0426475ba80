"""'did you mean ...?' for a method, exercise or claim name that lmpo does not know, in the
command's language; the match itself is `lmpo.algos.registry.closest`, as for every other name."""

from __future__ import annotations

from typing import Iterable

from lmpo.names import closest
from lmpo.teach.refusals import refusal

__all__ = ["closest", "did_you_mean"]


def did_you_mean(name: str, known: Iterable[str], lang: str = "en") -> str:
    """` (did you mean 'grpo'?)` (in `lang`) to put after the name in an error, or "" when no name is near."""
    near = closest(name, known)
    return refusal("did_you_mean", lang, near=repr(near)) if near else ""
