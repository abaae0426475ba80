"""Held-out evaluation: greedy episodes through the agent loop, graded by the task's own grader."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import torch

from lmpo.envs.base import Grade, Problem, Task
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
    """The first few episodes, for people to read."""

    def as_dict(self) -> dict:
        return {"accuracy": self.accuracy, "format_accuracy": self.format_accuracy, "n": self.n,
                "tool_call_rate": self.tool_call_rate, "turns_mean": self.turns_mean,
                "terminations": self.terminations}

    def metrics(self, prefix: str = "eval_") -> dict:
        row = {f"{prefix}accuracy": self.accuracy, f"{prefix}format_accuracy": self.format_accuracy}
        if self.tool_call_rate or self.turns_mean != 1.0:
            row[f"{prefix}tool_call_rate"] = self.tool_call_rate
            row[f"{prefix}turns_mean"] = self.turns_mean
        row.update({f"{prefix}termination_{k}": v for k, v in self.terminations.items()})
        return row


def encode_prompts(tokenizer, problems: Sequence[Problem]) -> list[list[int]]:
    return [tokenizer(p.prompt, add_special_tokens=False).input_ids for p in problems]


def grade_all(task: Task, trajectories: Sequence[Trajectory]) -> list[Grade]:
    return [task.grade(t.problem, t.final_text, t.terminated) for t in trajectories]


@torch.no_grad()
def evaluate(model, tokenizer, task: Task, problems: Sequence[Problem], *, max_new_tokens: int = 16,
             batch_size: int = 256, n_examples: int = 5, max_turns: int = 0, max_turn_tokens: int = 0,
             max_parse_errors: int = 3) -> EvalResult:
    """Greedy accuracy, format accuracy, tool use and termination reasons on `problems`."""
    runner = EpisodeRunner.for_task(task, model, tokenizer, SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens),
                                    max_turns=max_turns, max_turn_tokens=max_turn_tokens,
                                    max_parse_errors=max_parse_errors)
    grades: list[Grade] = []
    kept: list[Trajectory] = []
    tool_users = turns = 0
    reasons: Counter[str] = Counter()
    for start in range(0, len(problems), batch_size):
        trajectories = runner.run(problems[start:start + batch_size])
        grades += grade_all(task, trajectories)
        kept += trajectories[:max(0, n_examples - len(kept))]
        tool_users += sum(t.tool_calls > 0 for t in trajectories)
        turns += sum(t.turns for t in trajectories)
        reasons.update(t.termination for t in trajectories)
    n = max(len(grades), 1)
    examples = [{"prompt": t.problem.prompt, "completion": t.final_text, "answer": t.problem.answer,
                 "correct": g.correct} for t, g in zip(kept, grades)]
    return EvalResult(accuracy=sum(g.correct for g in grades) / n,
                      format_accuracy=sum(g.well_formed for g in grades) / n, n=len(grades), examples=examples,
                      tool_call_rate=tool_users / n, turns_mean=turns / n,
                      terminations={k: v / n for k, v in sorted(reasons.items())}, trajectories=kept)
