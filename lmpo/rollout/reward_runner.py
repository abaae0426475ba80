"""Calling reward functions safely: a reward that raises, hangs or returns None/NaN makes its
completion *unscorable* instead of crashing the run or silently scoring 0.

Each reward function runs in its own worker process, so that its timeout is enforced from
outside the call: when a call overruns, the parent kills the worker (and starts a fresh one
for the next call); no cooperation from the function is needed. A call covers the whole batch;
if it fails as a whole, every completion is retried alone (each with the same timeout, or, after
the batch timed out, an equal share of one more timeout), so
one bad completion does not take its batch-mates down with it. A function that returns something
other than one score per completion (a number, a dict, a list of the wrong length) is broken,
not unable to score one: that stops the run whatever the failure policy.

`timeout_s=0` calls the functions in this process instead (no isolation, no timeout): exceptions
and None/NaN are still caught, but a hang is not. Functions named in `trusted` (the package's own
graders, pure and bounded) are always called in this process.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import weakref
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Literal, Sequence

import torch

from lmpo.envs.base import Grade, Problem, Task
from lmpo.envs.reward_worker import DEFAULT_MEMORY_MB, NotScores, as_scores, unpicklable
from lmpo.envs.rewards import GRADE_FIELDS, REWARDS, RewardFn, parse_reward_weights, reward_functions
from lmpo.envs.user_calls import inside

FailurePolicy = Literal["unscorable", "error"]
STARTUP_TIMEOUT_S = 300.0
TIMED_OUT = "no answer within"


class RewardFailure(RuntimeError):
    """A reward function failed and the failure policy is "error", returned something other than
    one score per completion, or its worker could not start; `function` names it (the reward's name in
    `--rewards`), `unscorable` is how many completions it left unscored (0: not known), and
    `kind` the failure's kind where the message alone does not say it."""

    def __init__(self, message: str, function: str = "?", unscorable: int = 0, kind: str = ""):
        super().__init__(message)
        self.function, self.unscorable, self.kind = function, unscorable, kind


@dataclass
class RewardScores:
    """`components[name][i]`: reward `name` of completion i (0.0 where unscorable);
    `valid[i]`: every reward of completion i is a finite number; `failures[name]`: how many
    completions reward `name` could not score, and `reasons[name]` the first reason;
    `retried[name]`: why reward `name`'s batch call failed where calls on single completions
    then scored some of them."""

    components: dict[str, torch.Tensor]
    valid: torch.Tensor
    failures: dict[str, int] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    retried: dict[str, str] = field(default_factory=dict)


class _Worker:
    """One reward function in a child interpreter (`python -m lmpo.envs.reward_worker`), fed
    through a pair of pipes. A fresh interpreter rather than a fork: the trainer's threads
    (OpenMP, the rollout engine's) must not be copied into a process mid-lock."""

    memory_mb, log_path = DEFAULT_MEMORY_MB, None  # the worker's memory limit; where its output goes

    def __init__(self, fn: RewardFn, name: str = "?"):
        self.fn, self.name, self.process, self.reader, self.writer = fn, name, None, None, None

    def call(self, args: tuple, timeout_s: float) -> tuple[str, object]:
        if self.process is None or self.process.poll() is not None:
            self._start()
        try:
            self.writer.send(args)
        except (TypeError, AttributeError, pickle.PicklingError) as err:  # pickled before a byte is sent
            raise RewardFailure(f"reward function {self.name!r}: {unpicklable(args[0], err)}", self.name, len(args[1]),
                                kind="contract") from None
        try:
            if not self.reader.poll(timeout_s):
                self.stop()
                return "timeout", f"{TIMED_OUT} {timeout_s:.3g} s (the worker was killed)"
            return self.reader.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            code = self._reap()
            self.stop()
            return "error", f"the worker process died: {describe_exit(code)}"

    def _reap(self) -> int | None:
        """The worker's exit status: its pipe closes a moment before the process is reaped, so an
        immediate poll() said `exit code None`."""
        if self.process is None:
            return None
        try:
            return self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None

    def _start(self) -> None:
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "lmpo.envs.reward_worker", str(to_child), str(from_child)],
            pass_fds=(to_child, from_child), start_new_session=True)  # its own group: killed as one
        os.close(to_child)
        os.close(from_child)
        self.reader, self.writer = Connection(to_parent, writable=False), Connection(from_parent, readable=False)
        self.writer.send((list(sys.path), torch.get_num_threads(), self.memory_mb, self.log_path))  # so that the function's module imports
        self.writer.send(self.fn)
        # the function's own start-up (imports, loading a reward model) is not charged to a call
        if not self.reader.poll(STARTUP_TIMEOUT_S):
            self.stop()
            raise RewardFailure(f"the worker for reward function {self.fn!r} did not start within {STARTUP_TIMEOUT_S} s",
                                self.name)
        status, detail = self.reader.recv()
        if status != "ready":
            self.stop()
            raise RewardFailure(f"the worker for reward function {self.fn!r} could not start: {detail}", self.name)

    def stop(self) -> None:
        if self.process is not None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(timeout=10)
            self.reader.close()
            self.writer.close()
        self.process = self.reader = self.writer = None


def failure_kind(reason: str) -> str:
    """A failure's kind, as recorded and printed, from its reason."""
    if reason.startswith(TIMED_OUT):
        return "timeout"
    if reason.startswith("MemoryError"):
        return "memory"
    if reason.startswith("the worker process died"):
        return "exit"
    if reason.startswith("returned"):
        return "value"
    return "exception"


def describe_exit(code: int | None) -> str:
    """`killed by SIGSEGV`, `exit code 0 (...)`: how a worker process ended, from its status."""
    if code is None:
        return "its pipe closed, and it had not exited 5 s later (it was then stopped)"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code} (the function ended its process: os._exit, or native code)"


def _stop_all(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.stop()


class RewardRunner:
    """Scores completions with named, weighted reward functions (see module docstring)."""

    def __init__(self, rewards: dict[str, tuple[RewardFn, float]], timeout_s: float = 60.0,
                 policy: FailurePolicy = "unscorable", trusted: Sequence[str] = ()):
        if timeout_s < 0:
            raise ValueError(f"reward timeout must be >= 0 seconds, got {timeout_s}")
        if policy not in ("unscorable", "error"):
            raise ValueError(f"reward failure policy must be 'unscorable' or 'error', got {policy!r}")
        self.rewards, self.timeout_s, self.policy = rewards, timeout_s, policy
        self._workers = {name: _Worker(fn, name) for name, (fn, _) in rewards.items()
                         if timeout_s > 0 and name not in trusted}
        # workers also stop when the runner is garbage-collected or the interpreter exits,
        # e.g. after a trainer raised before reaching close()
        self._finalizer = weakref.finalize(self, _stop_all, list(self._workers.values()))

    @classmethod
    def from_spec(cls, spec: str, reward_model: str = "", timeout_s: float = 60.0,
                  policy: FailurePolicy = "unscorable") -> "RewardRunner":
        """From `--rewards` (`"correct=1.0,rm=0.5,my_mod:fn=0.2"`); the built-in graders are trusted."""
        weights = parse_reward_weights(spec)
        fns = reward_functions(weights, reward_model)
        return cls({name: (fns[name], weights[name]) for name in weights}, timeout_s, policy, trusted=list(REWARDS))

    def weights(self) -> dict[str, float]:
        return {name: weight for name, (_, weight) in self.rewards.items()}

    def score(self, task: Task, problems: Sequence[Problem], completions: Sequence[str],
              terminated: Sequence[bool], grades: Sequence[Grade] | None = None) -> RewardScores:
        """`grades`: the task's grade of each episode (`evaluation.grade_all`); `correct` is read
        from them, so it judges what evaluation's accuracy judges (a task's `grade_trajectory`
        included)."""
        n = len(problems)
        valid = torch.ones(n, dtype=torch.bool)
        scores = RewardScores({}, valid)
        for name in self.rewards:
            if grades is not None and name in GRADE_FIELDS:
                scores.components[name] = torch.tensor([float(getattr(g, GRADE_FIELDS[name])) for g in grades])
                continue
            values, reason = self._call(name, (task, list(problems), list(completions), list(terminated)), n)
            if reason is not None:  # the batch failed as a whole: find out which completions fail
                # after a timeout the lone calls share one more timeout, not one each: a reward
                # that hangs on every completion would cost (n + 1) timeouts a step
                lone = self.timeout_s / n if reason.startswith(TIMED_OUT) else self.timeout_s
                values = [self._call(name, (task, [p], [c], [t]), 1, lone)[0][0]
                          for p, c, t in zip(problems, completions, terminated)]
                if any(v is not None for v in values):
                    scores.retried[name] = reason
            bad = [i for i, v in enumerate(values) if v is None]
            if bad:
                first = reason or getattr(values, "reason", None) or "returned None or a non-finite number"
                if self.policy == "error":
                    raise RewardFailure(f"reward function {name!r} could not score the completion "
                                        f"{completions[bad[0]]!r} of prompt {problems[bad[0]].prompt!r}: {first}", name,
                                        kind=failure_kind(first))
                scores.failures[name], scores.reasons[name] = len(bad), first
                valid[bad] = False
            scores.components[name] = torch.tensor([0.0 if v is None else v for v in values])
        return scores

    def _call(self, name: str, args: tuple, n: int, timeout_s: float | None = None) -> tuple[list[float | None], str | None]:
        if name in self._workers:
            status, payload = self._workers[name].call(args, self.timeout_s if timeout_s is None else timeout_s)
        else:
            try:
                with inside(lambda: f"reward function {name!r} on {n} completion{'s' * (n != 1)}"):
                    status, payload = "ok", as_scores(self.rewards[name][0](*args))
            except NotScores as err:
                status, payload = "contract", str(err)
            except Exception as err:  # noqa: BLE001
                status, payload = "error", f"{type(err).__name__}: {err}"
            except SystemExit as err:  # a worker reports it too; in this process it would end the run as a success
                status, payload = "error", f"SystemExit: {err}"
        if status == "ok" and len(payload) != n:
            got = len(payload)
            status, payload = "contract", f"returned {got} score{'s' * (got != 1)} for {n} completion{'s' * (n != 1)}"
        if status == "contract":
            # not a completion it could not score but a broken contract: retrying the completions
            # one by one would hide it (a function that always returns one score "works" alone)
            raise RewardFailure(f"reward function {name!r} {payload}; a reward function returns one score per "
                                "completion, in the order of `completions`", name, unscorable=n, kind="contract")
        if status != "ok":
            return [None] * n, str(payload)
        return payload, None

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> "RewardRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
