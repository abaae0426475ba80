"""Held-out evaluation: greedy episodes through the agent loop, graded by the task's own grader."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from lmpo.envs.base import Grade, Problem, Task
from lmpo.envs.env import env_raised
from lmpo.envs.user_calls import inside_unless_lmpo
from lmpo.rollout.agent_loop import EpisodeRunner
from lmpo.rollout.trajectory import Trajectory
from lmpo.rollout.types import SamplingParams


@dataclass
class EvalResult:
    accuracy: float
    format_accuracy: float
    n: int
    examples: list[dict] = field(default_factory=list)
    tool_call_rate: float = 0.0
    """Share of episodes that called a tool at least once."""
    turns_mean: float = 1.0
    terminations: dict[str, float] = field(default_factory=dict)
    """Share of episodes per termination reason."""
    trajectories: list[Trajectory] = field(default_factory=list, repr=False)
    """The first few episodes, for people to read (every one with `evaluate(keep_all=True)`)."""
    grades: list[Grade] = field(default_factory=list, repr=False)
    """The grade of each episode in `trajectories`."""
    pass_at: dict[int, float] = field(default_factory=dict)
    """Sampled episodes (`evaluate(sampling=...)`): pass@k per k (the unbiased estimator, `pass_at_k`)."""
    breakdown: dict = field(default_factory=dict)
    """Agent figures beyond success (see `breakdown`): hand-offs, environment tallies per
    episode, and the same per problem kind; empty for tasks whose episodes carry none."""

    def as_dict(self) -> dict:
        return {"accuracy": self.accuracy, "format_accuracy": self.format_accuracy, "n": self.n,
                **({"pass_at": self.pass_at} if self.pass_at else {}),
                "tool_call_rate": self.tool_call_rate, "turns_mean": self.turns_mean,
                "terminations": self.terminations, **({"breakdown": self.breakdown} if self.breakdown else {})}

    def metrics(self, prefix: str = "eval_") -> dict:
        row = {f"{prefix}accuracy": self.accuracy, f"{prefix}format_accuracy": self.format_accuracy}
        if self.tool_call_rate or self.turns_mean != 1.0:
            row[f"{prefix}tool_call_rate"] = self.tool_call_rate
            row[f"{prefix}turns_mean"] = self.turns_mean
        row.update({f"{prefix}termination_{k}": v for k, v in self.terminations.items()})
        overall = {k: v for k, v in self.breakdown.items() if k != "by_kind" and isinstance(v, float)}
        row.update({f"{prefix}{k}": v for k, v in overall.items()})
        for kind, figures in self.breakdown.get("by_kind", {}).items():
            row[f"{prefix}kind_{kind}_accuracy"] = figures["accuracy"]
        return row


class GraderError(RuntimeError):
    """A task's grader raised, or returned something other than a `Grade`: a bug in the task (a
    grader marks malformed output incorrect and never raises), reported with the episode."""


def grade_all(task: Task, trajectories: Sequence[Trajectory]) -> list[Grade]:
    """The task's grade of each episode: `task.grade_trajectory(t)` where the task judges whole
    episodes (its environment's final state, e.g. a database), else its grader on the final answer.
    GraderError when the grader raises or returns no `Grade`."""
    by_episode = getattr(task, "grade_trajectory", None)
    if callable(by_episode):
        return [_checked(task, "grade_trajectory", by_episode, t, t) for t in trajectories]
    return [_checked(task, "grade", task.grade, t, t.problem, t.final_text, t.terminated) for t in trajectories]


def _checked(task: Task, method: str, grader: Callable, episode: Trajectory, *args) -> Grade:
    where = (f"task {getattr(task, 'name', type(task).__name__)!r}: {type(task).__name__}.{method}() on the "
             f"completion {episode.final_text[:200]!r} of the prompt {episode.problem.prompt[:200]!r}")
    try:
        with inside_unless_lmpo(grader, lambda: where):
            grade = grader(*args)
    except (Exception, SystemExit) as err:  # noqa: BLE001 -- the user's grader: any bug is named with its episode
        raise GraderError(f"{env_raised(where, err)}; a grader marks malformed output incorrect and never "
                          f"raises") from err
    if not (hasattr(grade, "correct") and hasattr(grade, "well_formed")):
        raise GraderError(f"{where} returned {type(grade).__name__} {str(grade)[:80]!r}, not a "
                          f"Grade(correct, well_formed) (lmpo.envs.base.Grade)")
    return grade


def breakdown(trajectories: Sequence[Trajectory], grades: Sequence[Grade]) -> dict:
    """Hand-offs and environment tallies overall and per problem kind (`problem.meta["kind"]`).

    A hand-off (`info["handoff"]`) is correct when the episode succeeded and unnecessary when
    the problem did not call for one (`problem.meta["handoff"]` false). Rates are shares of
    episodes; a tally (`info["counts"]`) is a mean per episode. Empty when no episode has a
    kind, a hand-off or a tally."""
    pairs = list(zip(trajectories, grades))
    if not any(t.problem.meta.get("kind") or "handoff" in t.info or t.info.get("counts") for t in trajectories):
        return {}

    def figures(group: list) -> dict:
        n = max(len(group), 1)
        handoffs = [(t, g) for t, g in group if t.info.get("handoff")]
        out = {"n": len(group), "accuracy": sum(g.correct for _, g in group) / n,
               "handoff_rate": len(handoffs) / n,
               "handoff_correct": sum(g.correct for _, g in handoffs) / n,
               "handoff_unnecessary": sum(not t.problem.meta.get("handoff", False) for t, _ in handoffs) / n}
        names = sorted({k for t, _ in group for k in t.info.get("counts", {})})
        out.update({f"{k}_mean": sum(t.info.get("counts", {}).get(k, 0) for t, _ in group) / n for k in names})
        ends = Counter(t.termination for t, _ in group)
        out["terminations"] = {k: v / n for k, v in sorted(ends.items())}
        return out

    result = {k: v for k, v in figures(pairs).items() if k not in ("n", "accuracy", "terminations")}
    kinds = sorted({str(t.problem.meta["kind"]) for t in trajectories if t.problem.meta.get("kind")})
    if kinds:
        result["by_kind"] = {k: figures([(t, g) for t, g in pairs if t.problem.meta.get("kind") == k]) for k in kinds}
    return result


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of k of a problem's n samples is correct, c of them being
    correct: 1 - C(n-c, k) / C(n, k), the unbiased estimator of Chen et al. (2021, Codex), as a
    product so that large n stays exact enough."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_at_ks(samples: int) -> list[int]:
    """The k reported for `samples` samples per problem: the powers of two below it, and it."""
    return sorted({*(2 ** i for i in range(samples.bit_length()) if 2 ** i < samples), samples})


@torch.no_grad()
def evaluate(model, tokenizer, task: Task, problems: Sequence[Problem], *, max_new_tokens: int = 16,
             batch_size: int = 256, n_examples: int = 5, max_turns: int = 0, max_turn_tokens: int = 0,
             max_parse_errors: int = 3, keep_all: bool = False, sampling: SamplingParams | None = None,
             samples: int = 1, generator: torch.Generator | None = None,
             on_batch: Callable[[int, float], None] | None = None,
             budget_option: str = "--max_new_tokens") -> EvalResult:
    """Greedy accuracy, format accuracy, tool use and termination reasons on `problems`; the result
    keeps the first `n_examples` episodes, or with `keep_all` every one. With `sampling` (its
    `max_new_tokens` replaces the argument's), `samples` episodes per problem, drawn from
    `generator`: accuracy is then the mean over them (pass@1), and `pass_at` holds pass@k.
    `on_batch(episodes done, accuracy so far)` follows progress. `budget_option`: the option that set
    the episode budget, for a warning that it is too short to name (a trainer's `--eval_max_new_tokens`)."""
    if samples < 1 or (samples > 1 and sampling is None):
        raise ValueError(f"samples={samples}: several samples per problem need sampling parameters")
    params = sampling or SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    runner = EpisodeRunner.for_task(task, model, tokenizer, params, generator=generator,
                                    max_turns=max_turns, max_turn_tokens=max_turn_tokens,
                                    max_parse_errors=max_parse_errors, budget_option=budget_option)
    problems = [p for p in problems for _ in range(samples)]
    grades: list[Grade] = []
    kept: list[Trajectory] = []
    everything: list[Trajectory] = []
    tool_users = turns = 0
    reasons: Counter[str] = Counter()
    for start in range(0, len(problems), batch_size):
        trajectories = runner.run(problems[start:start + batch_size])
        grades += grade_all(task, trajectories)
        everything += trajectories
        kept += trajectories[:max(0, n_examples - len(kept))]
        tool_users += sum(t.tool_calls > 0 for t in trajectories)
        turns += sum(t.turns for t in trajectories)
        reasons.update(t.termination for t in trajectories)
        if on_batch is not None:
            on_batch(len(grades), sum(g.correct for g in grades) / len(grades))
    n = max(len(grades), 1)
    examples = [{"prompt": t.problem.prompt, "completion": t.final_text, "answer": t.problem.answer,
                 "correct": g.correct} for t, g in zip(kept, grades)]
    return EvalResult(accuracy=sum(g.correct for g in grades) / n,
                      format_accuracy=sum(g.well_formed for g in grades) / n, n=len(grades), examples=examples,
                      tool_call_rate=tool_users / n, turns_mean=turns / n,
                      terminations={k: v / n for k, v in sorted(reasons.items())},
                      trajectories=everything if keep_all else kept, grades=grades if keep_all else grades[:len(kept)],
                      breakdown=breakdown(everything, grades),
                      pass_at=_pass_at(grades, samples) if sampling is not None else {})


def _pass_at(grades: list[Grade], samples: int) -> dict[int, float]:
    """pass@k averaged over problems, each problem's `samples` grades consecutive in `grades`."""
    correct = [sum(g.correct for g in grades[i:i + samples]) for i in range(0, len(grades), samples)]
    return {k: sum(pass_at_k(samples, c, k) for c in correct) / max(len(correct), 1) for k in pass_at_ks(samples)}
