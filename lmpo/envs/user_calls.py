"""`inside(describe)`: the trainer is running a user's code (an environment's `make_env`, `reset`
or `step`, a task's grader, an in-process reward function); what that code does to the process is
then said with its name.

- `os._exit()` called there raises `ProcessExit` in the calling thread instead, which the agent
  loop records as the episode's `env_error`, as it does `sys.exit()`'s SystemExit: before, the run
  ended in silence, with exit code 0 for `os._exit(0)`.
- A process that dies there anyway (the kernel's OOM killer, SIGKILL, native code calling
  `exit()`) cannot speak for itself: a small watcher process, started on first use, holds the
  other end of a pipe that names the call in progress and says it on stderr when the pipe closes
  mid-call.
- A call that runs `WARN_AFTER_S` is said once by the same watcher, naming it: a hang said nothing.
- lmpo's own tasks' calls go unwatched (`inside_unless_lmpo`): tested code, called too often to
  pay two writes each.
- `current()` is the call the main thread is inside (or waits on, for calls on the env worker
  threads) and since when: SIGTERM reads it to stop a run stuck there (`trainers.preemption`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Callable, Iterator

_local = threading.local()
_main: list[tuple[Callable[[], str], float]] = []  # the main thread's calls in progress, innermost last
_innermost: dict[int, Callable[[], str]] = {}  # each thread's innermost call in progress, by thread id
_real_exit = os._exit
_pid = os.getpid()


class ProcessExit(SystemExit):
    """`os._exit(code)` called by a user's code inside `inside()`."""


def _guarded_exit(code: int) -> None:
    if getattr(_local, "depth", 0) and os.getpid() == _pid:  # not a forked child, which must exit
        raise ProcessExit(f"called os._exit({code})")
    _real_exit(code)


@contextmanager
def inside(describe: Callable[[], str], started: float | None = None) -> Iterator[None]:
    """Run user code named by `describe()` (on the main thread called at once, for the watcher;
    on another only when said); `started`: when the call began, where the main thread waits on it
    from another thread."""
    if os._exit is _real_exit:  # not where a user's code set its own
        os._exit = _guarded_exit
    main = threading.current_thread() is threading.main_thread()
    entry = (describe, time.monotonic() if started is None else started)
    _local.depth = getattr(_local, "depth", 0) + 1
    thread, outer = threading.get_ident(), _innermost.get(threading.get_ident())
    _innermost[thread] = describe
    if main:
        _main.append(entry)
        _watcher.say(describe)
    try:
        yield
    finally:
        _local.depth -= 1
        if outer is None:
            _innermost.pop(thread, None)
        else:
            _innermost[thread] = outer
        if main:
            _main.remove(entry)
            _watcher.say(_main[-1][0] if _main else None)


def lmpo_owned(code: object) -> bool:
    """Whether `code` (an environment factory, a task's bound method) is one of lmpo's own tasks'
    (a subclass defined elsewhere is not): those are tested, and their calls are many and short."""
    owner = getattr(code, "__self__", None)
    module = type(owner).__module__ if owner is not None else getattr(code, "__module__", None)
    return isinstance(module, str) and (module == "lmpo" or module.startswith("lmpo."))


def inside_unless_lmpo(owner: object, describe: Callable[[], str]) -> AbstractContextManager:
    """`inside(describe)` for the code of a user's task; nothing for lmpo's own, whose calls would pay
    the watcher's two writes each: ~200 calls, ~3 ms, in a GRPO step of the sort task (~70 ms)."""
    return nullcontext() if lmpo_owned(owner) else inside(describe)


def unwatched() -> None:
    """The process is about to be ended on purpose, and says so itself: no watcher's message."""
    _watcher.say(None)
    _watcher.broken = True


def running_on(thread: int | None) -> str | None:
    """What the thread `thread` is running of user code, or None."""
    describe = _innermost.get(thread) if thread is not None else None
    return describe() if describe else None


def current() -> tuple[Callable[[], str], float] | None:
    """The main thread's innermost call of user code and when it began, or None."""
    return _main[-1] if _main else None


WARN_AFTER_S = 120.0
"""A call of user code that has run this long is said once on stderr: a hang otherwise says nothing."""

WATCH = r"""
import os, select, sys, time
pid, warn_after = sys.argv[1], float(sys.argv[2])
last, since, pending, fd = "", time.monotonic(), b"", sys.stdin.fileno()
while True:
    if select.select([fd], [], [], 1.0)[0]:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        if lines:
            last, since = lines[-1].decode("utf-8", "replace"), time.monotonic()
    elif last and since is not None and time.monotonic() - since >= warn_after:
        sys.stderr.write(f"lmpo: warning: {last} has run {warn_after:g} s and not returned; lmpo sets it no time "
                         f"limit (an environment's calls take the task's env_timeout): Ctrl-C or SIGTERM stops "
                         f"the run\n")
        sys.stderr.flush()
        since = None
if last:
    sys.stderr.write(f"lmpo: error: the trainer (pid {pid}) ended while {last} was running, without a word: it "
                     f"was killed (by the kernel's OOM killer if it ran out of memory: see `dmesg`; by a signal "
                     f"such as a second SIGTERM) or that code ended the process (native code calling exit())\n")
"""


class _Watcher:
    """The child that outlives this process; started on the first call of user code."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.broken = False

    def say(self, describe: Callable[[], str] | None) -> None:
        if self.broken:
            return
        try:
            if self.process is None:
                self.process = subprocess.Popen([sys.executable, "-c", WATCH, str(os.getpid()), str(WARN_AFTER_S)],
                                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                                start_new_session=True)  # Ctrl-C spares it
            text = describe().replace("\n", " ") if describe else ""
            self.process.stdin.write(text.encode("utf-8", "replace") + b"\n")
            self.process.stdin.flush()
        except Exception:  # noqa: BLE001 -- it could not start, or it is gone: no message, never a failure
            self.broken = True


_watcher = _Watcher()
