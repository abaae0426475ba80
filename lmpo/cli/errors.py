"""The errors `lmpo` reports as one line (`lmpo: error: ...`) instead of a traceback.

Exit code 2: bad input (options, data files, run directories, a full disk included:
`ConfigError`, `ValueError`, `RunDirError`). Exit code 1: a fault met while training that the
user can act on (every completion unscorable, repeated non-finite steps, another file-system
error), still one line that says what to do."""

from __future__ import annotations

import contextlib
import errno
import linecache
import re
import traceback

from lmpo.trainers.run_dir import RunDirError, check_resumable, command, saved_config, trainer_of


def run_command(name: str) -> contextlib.AbstractContextManager:
    """The `lmpo train NAME` being run, recorded in the run directory (see `run_dir.command`)."""
    return command(name)


def runtime_errors() -> tuple[type[BaseException], ...]:
    """Evaluated only when an exception reaches `main` (the reward runner imports torch)."""
    from lmpo.rollout.evaluation import GraderError
    from lmpo.rollout.reward_runner import RewardFailure
    from lmpo.trainers.collapse_guard import CollapseGuardStop
    from lmpo.trainers.harness import NonFiniteUpdates
    from lmpo.trainers.reward_watch import EnvFailure

    return (RewardFailure, EnvFailure, NonFiniteUpdates, CollapseGuardStop, GraderError, OSError)


def error_line(err: BaseException, lang: str, text: str) -> str:
    """The line `lmpo` prints for `err` (said as `text` in English): `lmpo: error: TEXT`. In
    Chinese the prefix is Chinese and an operating-system error (a missing file, a permission
    refused) is said in Chinese with its path, the system's English words kept in parentheses;
    lmpo's own refusals are already in the command's language."""
    from lmpo.teach.refusals import error_prefix, os_error_zh, said

    if (in_lang := said(err, lang)) is not None:
        text = in_lang
    elif lang == "zh" and isinstance(err, OSError) and not isinstance(err, RunDirError) and err.errno is not None:
        text = os_error_zh(err)
    return f"{error_prefix(lang)}{text}"


def one_line(err: BaseException) -> str:
    if isinstance(err, OSError) and not isinstance(err, RunDirError) and err.filename:
        from lmpo.trainers.fs_faults import fs_error

        return fs_error(err.filename, err, failed_action(err))
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


ACTIONS = (  # (action, names of calls that do it, prefixes of such names: write_starter writes)
    ("create", {"mkdir", "makedirs"}, ()),
    ("read", {"open", "stat", "listdir", "iterdir", "scandir", "getsize", "copyfile"}, ("read", "load")),
    ("write", {"touch", "replace", "rename", "unlink", "rmtree"}, ("write", "save", "dump")),
)
CALL = re.compile(r"\b(\w+)\(")
MODE = re.compile(r"""\bopen\(.*?["']([rwxabt+]{1,4})["']""")


def failed_action(err: OSError) -> str:
    """What the failed call did to its file ("read", "write", "create", else "access"): a full disk or
    a read-only file system refuse writes; otherwise the innermost call of its traceback whose name
    or mode says (an unreadable data file was said as `cannot write DATA`)."""
    from lmpo.trainers.fs_faults import DISK_FULL_ERRNOS

    if err.errno in (*DISK_FULL_ERRNOS, errno.EROFS):
        return "write"
    for frame, lineno in reversed(list(traceback.walk_tb(err.__traceback__))):
        name, mode = frame.f_code.co_name, frame.f_locals.get("mode")
        if name == "open" and isinstance(mode, str):  # Path.open, gzip.open, io.open: the mode it was given
            return "read" if set(mode) <= set("rbt") else "write"
        line = linecache.getline(frame.f_code.co_filename, lineno)
        if found := MODE.search(line):
            return "read" if set(found.group(1)) <= set("rbt") else "write"
        for called in [name, *reversed(CALL.findall(line))]:
            for action, names, prefixes in ACTIONS:  # open() without a mode reads
                if called in names or called.lstrip("_").startswith(prefixes):
                    return action
    return "access"


__all__ = ["error_line", "runtime_errors", "RunDirError", "check_resumable", "saved_config", "trainer_of", "one_line", "run_command"]
