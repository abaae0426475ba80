"""Per-step figures about episodes (tool use, parse errors, turns, observation share, why they
ended) and the trajectories written for people to read (`trajectories.jsonl`)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch

from lmpo.envs.base import Grade
from lmpo.envs.env import TERMINATIONS
from lmpo.rollout.evaluation import grade_all
from lmpo.rollout.trajectory import MODEL, PROMPT, Trajectory
from lmpo.trainers.runtime import keep_rows_through


def agent_figures(trajectories: list[Trajectory], limits) -> dict:
    """Termination shares always; tool calls, parse errors, turns and the observation share for multi-turn tasks."""
    n = max(len(trajectories), 1)
    ends = Counter(t.termination for t in trajectories)
    figures = {f"termination_{r}": ends[r] / n for r in TERMINATIONS if ends[r]}
    if limits.max_turns > 1:
        after = sum(t.num_tokens - t.prompt_length for t in trajectories)
        observed = sum(1 for t in trajectories for s in t.sources if s not in (PROMPT, MODEL))
        figures.update({"tool_calls_mean": sum(t.tool_calls for t in trajectories) / n,
                        "parse_errors_mean": sum(t.parse_errors for t in trajectories) / n,
                        "turns_mean": sum(t.turns for t in trajectories) / n,
                        "obs_token_frac": observed / max(after, 1)})
    return figures


class TrajectoryLog:
    """Appends the first `per_step` trajectories of each step (and of each evaluation) as JSON lines.

    `path` None: this process neither writes nor tidies the file (a rank other than 0: two
    processes rewriting it on resume raced each other's rename)."""

    def __init__(self, path: Path | None, tokenizer, per_step: int, resume_from_step: int | None = None):
        self.path, self.tokenizer = path, tokenizer
        self.per_step = per_step if path is not None else 0
        if path is None:
            return
        if resume_from_step is not None and path.exists():
            keep_rows_through(path, "step", resume_from_step)  # what the interrupted run wrote after its checkpoint
        elif resume_from_step is None and path.exists():
            path.unlink()

    def write(self, step: int, phase: str, trajectories: list[Trajectory], task, rewards: list | None = None,
              valid: list | None = None, training: list[dict] | None = None) -> None:
        """`training`: per trajectory, what the loss made of it (`training_records`); None for evaluations."""
        if not self.per_step:
            return
        with self.path.open("a", encoding="utf-8") as f:
            for i, t in enumerate(trajectories[:self.per_step]):
                grade = grade_all(task, [t])[0]  # a task that judges whole episodes is graded on the episode
                reward = None if rewards is None else (rewards[i] if valid is None or valid[i] else None)
                if rewards is None:
                    reward = float(grade.correct)
                row = trajectory_row(t, grade, reward, self.tokenizer, step, phase, i)
                f.write(json.dumps({**row, **(training[i] if training else {})}) + "\n")


def training_records(actions: list[str], loss_mask: torch.Tensor) -> list[dict]:
    """Per trajectory of a training batch: the termination policy's action for its ending and the
    tokens the loss was taken on (0 for a masked or excluded episode, and for one the `overlong`
    option masked), so a viewer can tell trained text from text that was only sampled."""
    counts = loss_mask.sum(dim=1).tolist()
    return [{"termination_action": a, "trained_tokens": int(n)} for a, n in zip(actions, counts)]


def trajectory_row(t: Trajectory, grade: Grade, reward: float | None, tokenizer, step: int, phase: str,
                   index: int) -> dict:
    """One episode as `trajectories.jsonl` holds it, and `lmpo trajectories` reads it."""
    return {"step": step, "phase": phase, "index": index, "prompt": t.problem.prompt, "answer": t.problem.answer,
            "reward": reward, "correct": grade.correct, "termination": t.termination, "turns": t.turns,
            "tool_calls": t.tool_calls, "parse_errors": t.parse_errors, "num_tokens": t.num_tokens,
            "num_model_tokens": t.num_model_tokens, "segments": t.segments(tokenizer),
            **{key: t.info[key] for key in ("error", "tool_crashes") if key in t.info}}
