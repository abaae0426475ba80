"""Tasks (dataset + grader), reward functions and held-out evaluation.

The evaluation names (which need torch and transformers) are imported on first use, so that a
process that needs only a task's grader, such as a reward worker, starts in milliseconds.
"""

from __future__ import annotations

from lmpo.envs.base import Grade, Problem, Task
from lmpo.envs.registry import TASKS, make_task
from lmpo.envs.rewards import REWARDS, parse_reward_weights, reward_functions
from lmpo.envs.sort_digits import SortDigits

_EVALUATION = ("EvalResult", "decode_completions", "encode_prompts", "evaluate", "grade_all")

__all__ = ["Grade", "Problem", "REWARDS", "SortDigits", "TASKS", "Task", "make_task", "parse_reward_weights",
           "reward_functions", *_EVALUATION]


def __getattr__(name: str):
    if name in _EVALUATION:
        from lmpo.envs import evaluation

        return getattr(evaluation, name)
    raise AttributeError(f"module 'lmpo.envs' has no attribute {name!r}")
