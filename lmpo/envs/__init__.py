"""Tasks (dataset + grader), reward functions and held-out evaluation."""

from lmpo.envs.base import Grade, Problem, Task
from lmpo.envs.evaluate import EvalResult, decode_completions, encode_prompts, evaluate, grade_all
from lmpo.envs.registry import TASKS, make_task
from lmpo.envs.rewards import REWARDS, parse_reward_weights, reward_functions
from lmpo.envs.sort_digits import SortDigits

__all__ = ["EvalResult", "Grade", "Problem", "REWARDS", "SortDigits", "TASKS", "Task", "decode_completions",
           "encode_prompts", "evaluate", "grade_all", "make_task", "parse_reward_weights", "reward_functions"]
