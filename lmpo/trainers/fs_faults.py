"""File-system faults said in one line: a full disk (as the OS, torch.save and safetensors each
report it), a read-only file system, a permission refused."""

from __future__ import annotations

import errno
import os
from pathlib import Path

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# torch.save reports a failed write from C++ ("[enforce fail at inline_container.cc:672] . unexpected pos ...")
TORCH_WRITE_FAILURES = ("inline_container", "unexpected pos", "file write failed", "PytorchStreamWriter failed")
# safetensors: SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
OTHER_WRITE_FAILURES = ("No space left on device", "os error 28", "Disk quota exceeded")


def is_disk_full(err: BaseException) -> bool:
    if isinstance(err, OSError) and err.errno in DISK_FULL_ERRNOS:
        return True
    if isinstance(err, RuntimeError) and any(s in str(err) for s in TORCH_WRITE_FAILURES):
        return True
    return not isinstance(err, OSError) and any(s in str(err) for s in OTHER_WRITE_FAILURES)


def fault_cause(err: BaseException) -> str:
    """The cause of a failed write, in a few words."""
    if is_disk_full(err):
        return "no space left on the device (the disk is full)"
    if isinstance(err, OSError):
        if err.errno == errno.EROFS:
            return "read-only file system"
        if err.errno in (errno.EACCES, errno.EPERM):
            return "permission denied"
        if err.errno == errno.ENOTDIR:
            return "a part of the path is a file, not a directory"
        if err.errno == errno.EEXIST:
            return "a part of the path exists and is not a directory"
        return err.strerror or str(err)
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def fs_error(path: str | Path, err: BaseException, action: str = "write") -> str:
    """One line for a failed `action` (a write, by default) of `path`."""
    return f"cannot {action} {path}: {fault_cause(err)}"


# --out paths checked before any work: a bad one is refused in one line (exit 2), not after the work


def blocking_file(path: Path) -> Path | None:
    """The first existing part of `path` (from the root down, `path` itself included) that is not a
    directory, so that nothing can be made under it; None if there is none."""
    for part in [*reversed(path.parents), path]:
        if not part.exists():
            return None
        if not part.is_dir():
            return part
    return None


OUT_WORDS = {
    "is_file": "{flag} {out}: is a file; give a directory",
    "blocked": "{flag} {out}: {blocker} is a file, so no directory can be made under it",
    "cannot_make": "{flag} {out}: cannot make this directory ({reason})",
    "not_writable": "{flag} {out}: this directory is not writable",
}
"""ready_dir's refusals; a caller that speaks another language passes its own (lmpo.teach.refusals)."""


def ready_dir(out: str | Path, flag: str = "--out", words: dict[str, str] = OUT_WORDS) -> Path:
    """`out` as a directory that exists and can be written, made if needed; a ValueError naming
    what is wrong otherwise (in `words`)."""
    path = Path(out)
    blocker = blocking_file(path)
    if blocker == path:
        raise ValueError(words["is_file"].format(flag=flag, out=out))
    if blocker is not None:
        raise ValueError(words["blocked"].format(flag=flag, out=out, blocker=blocker))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(words["cannot_make"].format(flag=flag, out=out, reason=err.strerror or err)) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(words["not_writable"].format(flag=flag, out=out))
    return path
