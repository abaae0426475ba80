"""Reward failures that say why: a trainer's reward runner, watched.

- The first failures of each reward function (its exception text, a timeout, the memory
  limit, the worker's exit, a value that is not a number) go to `RUN_DIR/reward_failures.jsonl`
  and, one line each, to the terminal; later ones are only counted (the metrics'
  `unscorable_<fn>`).
- When every completion of a scoring round (an RL step, an online DPO round) was unscorable
  for `max_unscorable_steps` consecutive rounds, the run stops with an error that quotes the
  reasons: nothing is being learnt, and a run that only looked finished would exit 0.
- Each reward worker gets the memory limit `reward_memory_mb`, and its output (bounded) goes
  to `RUN_DIR/reward_workers.log` instead of the trainer's stdout.
- Episodes an environment broke (it raised, returned something that is not a well-formed `Step`
  or a non-finite reward: `env_error`; a tool overran: `tool_timeout`) are said the same way
  (`note_episodes`), as are episodes whose prompt alone fills the model's context, and a run whose
  every episode broke for `max_unscorable_steps` rounds stops:
  they are excluded from training, so such a run would otherwise train on nothing and exit 0.
- A tool that raised something other than ToolError (the model saw the error; it may be the
  tool's bug) is said on the terminal for the first rounds it happens in, naming file and line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lmpo.envs.env import CONTEXT_OVERFLOW, INFRASTRUCTURE_ENDINGS
from lmpo.rollout.reward_runner import RewardFailure, RewardRunner, RewardScores, failure_kind
from lmpo.trainers.distributed import Distributed

FAILURES_FILE = "reward_failures.jsonl"
WORKER_LOG = "reward_workers.log"
FIRST_FAILURES = 3  # recorded per reward function


class EnvFailure(RuntimeError):
    """Every episode of `max_unscorable_steps` consecutive rounds was broken by its environment."""


class WatchedRewards:
    """Wraps a `RewardRunner`: same interface, plus the records and the stop described above."""

    def __init__(self, runner: RewardRunner, out: Path, max_unscorable_steps: int, memory_mb: int,
                 ctx: Distributed = Distributed()):
        self.runner, self.out, self.ctx = runner, Path(out), ctx
        self.max_unscorable_steps = max_unscorable_steps
        self.path = self.out / FAILURES_FILE
        self.recorded: dict[str, int] = {}
        self.retries_said: set[str] = set()
        self.rounds = self.streak = 0
        self.last_reasons: dict[str, str] = {}
        self.env_rounds = self.env_streak = self.env_said = self.crashes_said = 0
        self.env_reason = ""
        for name, worker in getattr(runner, "_workers", {}).items():
            limit = max(memory_mb, _model_memory_mb(worker.fn)) if name == "rm" else memory_mb
            worker.memory_mb, worker.log_path = limit, str(self.out / WORKER_LOG)

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def score(self, task, problems, completions, terminated, grades=None) -> RewardScores:
        self.rounds += 1
        try:
            scores = self.runner.score(task, problems, completions, terminated, grades)
        except RewardFailure as err:  # reward_failure=error or a wrong count: recorded too, then stops the run
            self._record(err.function, err.unscorable or 1, len(problems), str(err), err.kind)
            raise
        for name, reason in scores.retried.items():
            if name not in self.retries_said:
                self.retries_said.add(name)
                self._note_retry(name, len(problems), reason)
        for name, count in scores.failures.items():
            reason = scores.reasons.get(name, "")
            self.last_reasons[name] = reason
            if self.recorded.get(name, 0) < FIRST_FAILURES:
                self.recorded[name] = self.recorded.get(name, 0) + 1
                self._record(name, count, len(problems), reason)
        # every process's: under torchrun the stop is the run's, not one process's (each scores once a round)
        everything_failed = self.ctx.all_true(len(problems) > 0 and not bool(scores.valid.any()))
        self.streak = self.streak + 1 if everything_failed else 0
        if self.max_unscorable_steps and self.streak >= self.max_unscorable_steps:
            why = "; ".join(f"{name}: {_first_line(r)}" for name, r in self.last_reasons.items())
            raise RewardFailure(f"every completion was unscorable in {self.streak} consecutive scoring rounds "
                                f"(max_unscorable_steps={self.max_unscorable_steps}); {why} "
                                f"(first failures in {self.path})")
        return scores

    def note_episodes(self, trajectories) -> None:
        """A round's episodes: those its environment broke said (the first rounds), and the stop."""
        broken = [t for t in trajectories if t.termination in INFRASTRUCTURE_ENDINGS or _no_room(t)]
        self.env_rounds += 1
        if broken:
            first = broken[0]
            self.env_reason = f"{first.termination}: {_first_line(str(first.info.get('error', '')))}"
            if self.env_said < FIRST_FAILURES:
                self.env_said += 1
                print(f"[env] {len(broken)} of {len(trajectories)} episodes ended in {self.env_reason} (nothing of "
                      f"them is trained; each one's error is in its trajectory)", file=sys.stderr)
        crashed = [t for t in trajectories if t.info.get("tool_crashes")]
        if crashed and self.crashes_said < FIRST_FAILURES:
            self.crashes_said += 1
            print(f"[tools] in {len(crashed)} of {len(trajectories)} episodes a tool raised: "
                  f"{_first_line(crashed[0].info['tool_crashes'][0])}. The model saw the error and the turn counted "
                  f"as its malformed call; if the tool is at fault, fix it, and raise ToolError for the refusals "
                  f"meant for the model", file=sys.stderr)
        all_broken = self.ctx.all_true(bool(trajectories) and len(broken) == len(trajectories))
        self.env_streak = self.env_streak + 1 if all_broken else 0
        if self.max_unscorable_steps and self.env_streak >= self.max_unscorable_steps:
            raise EnvFailure(f"every episode ended in an environment failure in {self.env_streak} consecutive rounds "
                             f"(max_unscorable_steps={self.max_unscorable_steps}); the last: {self.env_reason}")

    def _note_retry(self, name: str, total: int, reason: str) -> None:
        """Once per function: its batch call failed and single calls scored instead, a call per
        completion every such round, which nothing said."""
        self._append({"round": self.rounds, "function": name, "kind": "batch", "unscorable": 0, "of": total,
                      "reason": reason})
        print(f"[reward] {name} failed on the batch of {total} completions ({failure_kind(reason)}): "
              f"{_first_line(reason)}; it scored them one by one instead, a call per completion (said once; "
              f"see {self.path})", file=sys.stderr)

    def _record(self, name: str, count: int, total: int, reason: str, kind: str = "") -> None:
        entry = {"round": self.rounds, "function": name, "kind": kind or failure_kind(reason), "unscorable": count,
                 "of": total, "reason": reason}
        self._append(entry)
        print(f"[reward] {name} could not score {count} of {total} completions ({entry['kind']}): "
              f"{_first_line(reason)} (see {self.path})", file=sys.stderr)

    def _append(self, entry: dict) -> None:
        try:
            with self.path.open("a") as f:
                f.write(json.dumps(entry) + "\n")
        except OSError:
            pass  # the record is a courtesy; the terminal line still says it

    def close(self) -> None:
        """Stop the workers; a run shorter than `max_unscorable_steps` whose every completion was
        unscorable ends with the same error rather than a model trained on nothing."""
        self.runner.close()
        if self.max_unscorable_steps and self.env_rounds and self.env_streak == self.env_rounds:
            raise EnvFailure(f"every episode of all {self.env_rounds} rounds ended in an environment failure; the "
                             f"last: {self.env_reason}")
        if self.max_unscorable_steps and self.rounds and self.streak == self.rounds:
            why = "; ".join(f"{name}: {_first_line(r)}" for name, r in self.last_reasons.items())
            raise RewardFailure(f"every completion of all {self.rounds} scoring rounds was unscorable; {why} "
                                f"(first failures in {self.path})")

    def __enter__(self) -> "WatchedRewards":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _no_room(trajectory) -> bool:
    """An episode whose prompt alone filled the model's context: nothing could be sampled."""
    return trajectory.termination == CONTEXT_OVERFLOW and trajectory.num_model_tokens == 0


def note_episodes(rewards, trajectories) -> None:
    """`WatchedRewards.note_episodes` where the trainer's runner is watched (a bare runner, as
    tests and library callers pass, says nothing)."""
    if isinstance(rewards, WatchedRewards):
        rewards.note_episodes(trajectories)


def _model_memory_mb(fn) -> int:
    """What a reward model's worker needs at least: its weights three times over (loading,
    converting, running) and 2 GiB for the interpreter and torch."""
    path = getattr(fn, "path", None) or getattr(fn, "model_dir", None)
    if not path or not Path(path).is_dir():
        return 0
    weights = sum(p.stat().st_size for p in Path(path).glob("*.safetensors")) + \
        sum(p.stat().st_size for p in Path(path).glob("*.bin"))
    return 3 * (weights >> 20) + 2048


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "(no reason given)"
    return line if len(line) <= 300 else line[:297] + "..."


def watch_rewards(runner: RewardRunner, out: str | Path, cfg, ctx: Distributed = Distributed()) -> WatchedRewards:
    """`ctx`: the run's processes, which must all score (and note episodes) once a round alike."""
    from lmpo.envs.reward_worker import DEFAULT_MEMORY_MB

    return WatchedRewards(runner, Path(out), getattr(cfg, "max_unscorable_steps", 3),
                          getattr(cfg, "reward_memory_mb", DEFAULT_MEMORY_MB), ctx)
