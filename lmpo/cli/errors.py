"""The errors `lmpo` reports as one line (`lmpo: error: ...`) instead of a traceback.

Exit code 2: bad input (options, data files, run directories, a full disk included:
`ConfigError`, `ValueError`, `RunDirError`). Exit code 1: a fault met while training that the
user can act on (every completion unscorable, repeated non-finite steps, another file-system
error), still one line that says what to do."""

from __future__ import annotations

import contextlib

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
    from lmpo.teach.refusals import error_prefix, os_error_zh

    if lang == "zh" and isinstance(err, OSError) and not isinstance(err, RunDirError) and err.errno is not None:
        text = os_error_zh(err)
    return f"{error_prefix(lang)}{text}"


def one_line(err: BaseException) -> str:
    if isinstance(err, OSError) and not isinstance(err, RunDirError) and err.filename:
        from lmpo.trainers.fs_faults import fs_error

        return fs_error(err.filename, err)
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


__all__ = ["error_line", "runtime_errors", "RunDirError", "check_resumable", "saved_config", "trainer_of", "one_line", "run_command"]
