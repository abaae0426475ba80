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
that never returns holds one of them.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


class _Outcome:
    __slots__ = ("value", "error", "done")

    def __init__(self) -> None:
        self.value, self.error, self.done = None, None, threading.Event()


class EnvWorkers:
    def __init__(self, n: int = 1):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"env_workers must be a positive integer (environments stepped at once), got {n!r}")
        self.n = n
        self._queues: list[queue.SimpleQueue] = []
        self._threads: list[threading.Thread] = []

    def run(self, calls: Sequence[tuple[int, Callable[[], T]]]) -> list[T]:
        """Each `(episode, call)`'s result, in order. An exception a call raised is raised here,
        in the caller's thread, after every call has finished (the first one in order)."""
        if self.n == 1:
            return [call() for _, call in calls]
        outcomes = []
        for episode, call in calls:
            outcome = _Outcome()
            self._queue(episode % self.n).put((call, outcome))
            outcomes.append(outcome)
        for outcome in outcomes:
            while not outcome.done.wait(0.5):  # a timed wait: Ctrl-C reaches the main thread meanwhile
                pass
        for outcome in outcomes:
            if outcome.error is not None:
                raise outcome.error
        return [outcome.value for outcome in outcomes]

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
            q: queue.SimpleQueue = queue.SimpleQueue()
            thread = threading.Thread(target=_serve, args=(q,), name=f"lmpo-env-{len(self._queues)}", daemon=True)
            thread.start()
            self._queues.append(q)
            self._threads.append(thread)
        return self._queues[index]


def _serve(jobs: queue.SimpleQueue) -> None:
    while (job := jobs.get()) is not None:
        call, outcome = job
        try:
            outcome.value = call()
        except BaseException as error:  # noqa: BLE001 -- handed to the caller's thread, which decides
            outcome.error = error
        outcome.done.set()
