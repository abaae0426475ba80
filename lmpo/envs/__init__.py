"""Tasks and environments (no torch): problems with a held-out split, one grader that serves
evaluation and reward, reward functions, tools and the sandbox. Evaluation, which needs a
model, lives in `lmpo.rollout.evaluation`."""

from __future__ import annotations

from lmpo.envs.base import Grade, Problem, Task
from lmpo.envs.registry import TASKS, make_task
from lmpo.envs.rewards import REWARDS, parse_reward_weights, reward_functions
from lmpo.envs.sort_digits import SortDigits

__all__ = ["Grade", "Problem", "REWARDS", "SortDigits", "TASKS", "Task", "make_task", "parse_reward_weights",
           "reward_functions"]
