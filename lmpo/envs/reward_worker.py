"""The child side of `reward_runner`: `python -m lmpo.envs.reward_worker READ_FD WRITE_FD`.

Receives (sys.path, threads, memory limit in MB, output log path), then the reward function; answers ("ready", None), then answers
each call's arguments with ("ok", scores) or ("error", reason) until the pipe closes.
"""

from __future__ import annotations

import ctypes
import io
import math
import numbers
import os
import resource
import signal
import sys
import traceback
from multiprocessing.connection import Connection

PR_SET_PDEATHSIG = 1


DEFAULT_MEMORY_MB = 4096
"""A reward worker's memory limit (RLIMIT_DATA): an allocation past it fails with MemoryError,
which makes the call's completions unscorable with that reason."""
OUTPUT_LIMIT_BYTES = 1 << 20
"""What a worker may print (stdout and stderr together); the rest is dropped, with one note."""


def as_float(x) -> float | None:
    """A finite float, or None for anything else (None, NaN, inf, a string, a bool...)."""
    return _number(x)[0]


FLOAT32_MAX = 3.4028234663852886e38


def _number(x) -> tuple[float | None, str | None]:
    """(a finite float, None) or (None, why not). Only numbers count: a string such as "0.75" or a
    bool is not silently converted (the function most likely has a bug)."""
    if hasattr(x, "item") and not isinstance(x, (numbers.Real, str, bytes)):
        try:
            x = x.item()  # a numpy or torch scalar
        except (ValueError, RuntimeError, TypeError):
            pass
    if isinstance(x, bool):
        return None, f"returned {x!r} (a bool), not a number"
    if not isinstance(x, numbers.Real):
        if x is None:
            return None, "returned None"
        return None, f"returned {_short(x)} ({type(x).__name__}), not a number"
    try:
        value = float(x)
    except OverflowError:  # an int past the float range
        return None, f"returned {_short(x)}, past the range of a float"
    if not math.isfinite(value):
        return None, f"returned {value}"
    if abs(value) > FLOAT32_MAX:  # rewards are float32 tensors: it would become inf there
        return None, f"returned {value:g}, past the float32 range (±{FLOAT32_MAX:.3g}) rewards are computed in"
    return value, None


def _short(x) -> str:
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."


class Scores(list):
    """A reward function's scores (None where unscorable) and the first reason for a None."""

    reason: str | None = None


class NotScores(TypeError):
    """A reward function returned something other than a list of scores (a number, a dict, a
    string, None): a broken contract, not a completion it could not score."""


def as_scores(values) -> Scores:
    """`values` as scores, None for each one that is not a finite number; raises `NotScores` when
    `values` is not a list (or array, or other iterable) of them."""
    if (values is None or isinstance(values, (str, bytes, dict, numbers.Number)) or not hasattr(values, "__iter__")
            or getattr(values, "ndim", 1) == 0):
        raise NotScores(f"returned {_short(values)} ({type(values).__name__}), not a list of scores")
    if getattr(values, "ndim", 1) > 1:  # rows of one element would each pass as a scalar
        raise NotScores(f"returned a {type(values).__name__} of shape {tuple(values.shape)}, not a list of scores "
                        f"(one dimension, one number per completion)")
    out = Scores()
    for x in values:
        value, why = _number(x)
        out.append(value)
        if why is not None and out.reason is None:
            out.reason = why
    return out


def unpicklable(task, err: BaseException) -> str:
    """Why `task` cannot go to a reward worker, naming the attribute that holds what pickle refused
    (a database connection, a lock) where one does, and what to do."""
    import pickle

    attribute = ""
    for name, value in (vars(task).items() if hasattr(task, "__dict__") else ()):
        try:
            pickle.dumps(value)
        except Exception:  # noqa: BLE001 -- any failure names the attribute
            attribute = f" (its attribute {name!r}, a {type(value).__module__}.{type(value).__qualname__})"
            break
    return (f"the task {type(task).__name__} cannot be pickled{attribute}: {type(err).__name__}: {err}; a reward "
            "function of your own runs in a worker process, which receives the task with each call. Open such "
            "a resource in make_env() (each episode's environment) or on first use and leave it out of "
            "__getstate__, or give --reward_timeout 0 (the function runs in the trainer's process, without a "
            "time limit)")


class _BoundedWriter(io.TextIOBase):
    """stdout/stderr of a worker: at most `limit` bytes in all reach `fd`, then one note."""

    def __init__(self, fd: int, shared: list[int], limit: int):
        self.fd, self.shared, self.limit = fd, shared, limit

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        data = text.encode("utf-8", "replace")
        left = self.limit - self.shared[0]
        if left > 0:
            os.write(self.fd, data[:left])
            if len(data) > left:
                os.write(self.fd, f"\n[lmpo: reward worker output beyond {self.limit} bytes dropped]\n".encode())
        self.shared[0] += len(data)
        return len(text)


def capture_output(log_path: str | None, limit: int = OUTPUT_LIMIT_BYTES) -> None:
    """Nothing a reward function prints reaches the trainer's stdout: fds 1 and 2 go to
    `log_path` (the run directory's `reward_workers.log`), or to stderr without one; Python's
    prints are bounded to `limit` bytes."""
    target = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if log_path else os.dup(2)
    os.dup2(target, 1)
    os.dup2(target, 2)
    os.close(target)
    shared = [0]
    sys.stdout = _BoundedWriter(1, shared, limit)
    sys.stderr = _BoundedWriter(2, shared, limit)


def limit_memory(memory_mb: int) -> None:
    if memory_mb and memory_mb > 0:
        limit = memory_mb << 20
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit if hard == resource.RLIM_INFINITY else hard))


def serve(reader: Connection, writer: Connection) -> None:
    sys_path, threads, *rest = reader.recv()
    memory_mb, log_path = (list(rest) + [0, None])[:2]
    sys.path[:] = sys_path
    capture_output(log_path)
    limit_memory(memory_mb)
    try:
        if os.environ.get("LMPO_TASK_FILES"):  # the tasks its trainer loaded from files, which pickles name
            from lmpo.envs.plugins import load_task_files

            load_task_files()
        fn = reader.recv()  # imports the function's module: only what the function needs
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(threads)  # the trainer waits while a reward is computed
        if hasattr(fn, "setup"):  # e.g. a reward model loads its weights here, not in the trainer
            fn.setup()
    except MemoryError as err:
        writer.send(("error", f"MemoryError over the worker's memory limit of {memory_mb} MB while starting "
                              f"(raise --reward_memory_mb): {err}"))
        return
    except BaseException as err:  # noqa: BLE001 - reported to the trainer, which raises it
        writer.send(("error", f"{type(err).__name__}: {err}"))
        return
    writer.send(("ready", None))
    while True:
        try:
            args = reader.recv()
        except EOFError:
            return
        try:
            reply = ("ok", as_scores(fn(*args)))
        except NotScores as err:
            reply = ("contract", str(err))
        except MemoryError as err:
            reply = ("error", f"MemoryError over the worker's limit of {memory_mb} MB (raise --reward_memory_mb)"
                              f"{f': {err}' if str(err) else ''}")
        except BaseException as err:  # noqa: BLE001 - anything the function does is reported, not fatal
            reply = ("error", f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}")
        writer.send(reply)


if __name__ == "__main__":
    try:  # die with the trainer, even when it is killed mid-call (Linux)
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    from lmpo.envs import reward_worker  # this module under its own name: its `Scores` unpickle in the trainer

    reward_worker.serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
