"""The child side of `reward_runner`: `python -m lmpo.envs.reward_worker READ_FD WRITE_FD`.

Receives (sys.path, threads), then the reward function; answers ("ready", None), then answers
each call's arguments with ("ok", scores) or ("error", reason) until the pipe closes.
"""

from __future__ import annotations

import ctypes
import math
import signal
import sys
import traceback
from multiprocessing.connection import Connection

PR_SET_PDEATHSIG = 1


def as_float(x) -> float | None:
    """A finite float, or None for anything else (None, NaN, inf, a string...)."""
    try:
        value = float(x)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def serve(reader: Connection, writer: Connection) -> None:
    sys_path, threads = reader.recv()
    sys.path[:] = sys_path
    try:
        fn = reader.recv()  # imports the function's module: only what the function needs
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(threads)  # the trainer waits while a reward is computed
        if hasattr(fn, "setup"):  # e.g. a reward model loads its weights here, not in the trainer
            fn.setup()
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
            reply = ("ok", [as_float(x) for x in fn(*args)])
        except BaseException as err:  # noqa: BLE001 - anything the function does is reported, not fatal
            reply = ("error", f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}")
        writer.send(reply)


if __name__ == "__main__":
    try:  # die with the trainer, even when it is killed mid-call (Linux)
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
