"""Checks of an --out path made before any work, so that a bad one is refused in one line (exit 2)
instead of failing after the work, with errno text or exit code 1."""

from __future__ import annotations

import os
from pathlib import Path


def blocking_file(path: Path) -> Path | None:
    """The first existing part of `path` (from the root down, `path` itself included) that is not a
    directory, so that nothing can be made under it; None if there is none."""
    for part in [*reversed(path.parents), path]:
        if not part.exists():
            return None
        if not part.is_dir():
            return part
    return None


def ready_dir(out: str | Path, flag: str = "--out") -> Path:
    """`out` as a directory that exists and can be written, made if needed; a ValueError naming
    what is wrong otherwise."""
    path = Path(out)
    blocker = blocking_file(path)
    if blocker == path:
        raise ValueError(f"{flag} {out}: is a file; give a directory")
    if blocker is not None:
        raise ValueError(f"{flag} {out}: {blocker} is a file, so no directory can be made under it")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"{flag} {out}: cannot make this directory ({err.strerror or err})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {out}: this directory is not writable")
    return path
