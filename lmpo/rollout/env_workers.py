"""`EnvWorkers(n)`: where the agent loop runs its environments' calls.

With one worker (the default), every `make_env`, `reset` and `step` runs in the caller's thread,
one episode after another. With `n > 1`, episode `i`'s calls all run on worker thread `i % n`:
one episode's environment is created, reset and stepped on the same thread, so an environment
holding a resource bound to its thread (a `sqlite3` connection opened as Python's default
does) keeps working. A slow tool (a sandboxed program, a web request) then holds up only the
episodes sharing its thread, not the whole batch. Results come back in the order asked, so the
loop processes them as it would one by one; trajectories are the same as with one worker
whenever the environments share no state.

The threads are daemons: Ctrl-C or SIGTERM in the main thread ends the run even while a tool
that never returns holds one of them. With `timeout_s` (a task's `env_timeout`), every call runs
on a worker thread, one worker included, and a call that has run longer is given up: its result
is `on_timeout(timeout_s)`, its thread is left to the call, and the calls queued behind it go to a
fresh thread. Without it, an environment that never returns holds the run until Ctrl-C or SIGTERM
(`lmpo.trainers.preemption` stops a step stuck so).
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Sequence, TypeVar

from lmpo.envs.user_calls import inside, running_on

T = TypeVar("T")


class _Outcome:
    __slots__ = ("value", "error", "done", "started", "thread")

    def __init__(self) -> None:
        self.value, self.error, self.done, self.started = None, None, threading.Event(), 0.0
        self.thread: int | None = None  # the worker thread running it, once started


class EnvWorkers:
    def __init__(self, n: int = 1, timeout_s: float = 0.0, on_timeout: Callable[[float], object] | None = None):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"env_workers must be a positive integer (environments stepped at once), got {n!r}")
        self.n, self.timeout_s, self.on_timeout = n, timeout_s, on_timeout
        self._queues: list[queue.SimpleQueue] = []
        self._threads: list[threading.Thread] = []

    def run(self, calls: Sequence[tuple[int, Callable[[], T]]]) -> list[T]:
        """Each `(episode, call)`'s result, in order. An exception a call raised is raised here,
        in the caller's thread, after every call has finished (the first one in order)."""
        if self.n == 1 and not self.timeout_s:
            return [call() for _, call in calls]
        outcomes = []
        for episode, call in calls:
            outcome = _Outcome()
            self._queue(episode % self.n).put((call, outcome))
            outcomes.append((episode % self.n, outcome))
        for (episode, _), (index, outcome) in zip(calls, outcomes):
            with inside(lambda e=episode, o=outcome: running_on(o.thread) or f"the environment's call of episode {e}",
                        started=outcome.started or None):
                while not outcome.done.wait(0.5 if not self.timeout_s else min(0.5, self.timeout_s / 4)):
                    if self.timeout_s and outcome.started and time.monotonic() - outcome.started > self.timeout_s:
                        self._give_up(index, outcome)  # a timed wait: Ctrl-C reaches the main thread meanwhile
        for _, outcome in outcomes:
            if outcome.error is not None:
                raise outcome.error
        return [outcome.value for _, outcome in outcomes]

    def _give_up(self, index: int, outcome: _Outcome) -> None:
        """The call has overrun: its result is `on_timeout`'s, and the calls queued behind it move to a new thread."""
        outcome.value = self.on_timeout(self.timeout_s) if self.on_timeout else None
        outcome.done.set()
        old = self._queues[index]
        self._queues[index] = fresh = self._start()
        try:
            while (job := old.get_nowait()) is not None:
                fresh.put(job)
        except queue.Empty:
            pass
        old.put(None)  # the stuck thread ends, if its call ever returns

    def close(self) -> None:
        for q in self._queues:
            q.put(None)
        self._queues, self._threads = [], []

    def __enter__(self) -> "EnvWorkers":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _queue(self, index: int) -> queue.SimpleQueue:
        while len(self._queues) <= index:
            self._queues.append(self._start())
        return self._queues[index]

    def _start(self) -> queue.SimpleQueue:
        q: queue.SimpleQueue = queue.SimpleQueue()
        thread = threading.Thread(target=_serve, args=(q,), name=f"lmpo-env-{len(self._threads)}", daemon=True)
        thread.start()
        self._threads.append(thread)
        return q


def _serve(jobs: queue.SimpleQueue) -> None:
    while (job := jobs.get()) is not None:
        call, outcome = job
        if outcome.done.is_set():  # given up on while queued behind a call that overran
            continue
        outcome.started, outcome.thread = time.monotonic(), threading.get_ident()
        try:
            value = call()
            if not outcome.done.is_set():
                outcome.value = value
        except BaseException as error:  # noqa: BLE001 -- handed to the caller's thread, which decides
            if not outcome.done.is_set():
                outcome.error = error
        outcome.done.set()


def env_workers_of(task) -> int:
    """The task's `env_workers`: how many of its environments run at once, each episode's on a
    thread of its own (1, the default: one after another in the trainer's thread)."""
    workers = getattr(task, "env_workers", 1)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"task {type(task).__name__}: env_workers must be a positive integer (environments "
                         f"stepped at once, each episode's on a thread of its own), got {workers!r}")
    return workers


def env_timeout_of(task) -> float:
    """The task's `env_timeout`: seconds one call of its environment (make_env and reset, or a step)
    may take before the episode ends as `tool_timeout` (0, the default: no limit)."""
    timeout = getattr(task, "env_timeout", 0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0 or timeout == float("inf"):
        raise ValueError(f"task {type(task).__name__}: env_timeout must be a number of seconds of 0 or more (0: no "
                         f"limit), got {timeout!r}")
    return float(timeout)
