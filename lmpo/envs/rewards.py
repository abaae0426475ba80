"""Reward functions: `fn(task, problems, completions, terminated) -> list[float]`.

They call the task's grader, the same one that scores evaluation, so a reward can never
disagree with the reported accuracy.
"""

from __future__ import annotations

from typing import Callable, Sequence

from lmpo.envs.base import Problem, Task

RewardFn = Callable[[Task, Sequence[Problem], Sequence[str], Sequence[bool]], list[float]]


def correct_reward(task: Task, problems, completions, terminated) -> list[float]:
    """1 if the answer is right and terminated by EOS, else 0."""
    return [float(task.grade(p, c, t).correct) for p, c, t in zip(problems, completions, terminated)]


def format_reward(task: Task, problems, completions, terminated) -> list[float]:
    """1 if the completion is a well-formed answer terminated by EOS, right or wrong."""
    return [float(task.grade(p, c, t).well_formed) for p, c, t in zip(problems, completions, terminated)]


REWARDS: dict[str, RewardFn] = {"correct": correct_reward, "format": format_reward}
LEARNED_REWARD = "rm"  # a trained reward model; its directory is given separately


def parse_reward_weights(spec: str) -> dict[str, float]:
    """`"correct=1.0,format=0.1"` → {"correct": 1.0, "format": 0.1}; names checked."""
    weights: dict[str, float] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, eq, value = item.partition("=")
        name = name.strip()
        if name not in REWARDS and name != LEARNED_REWARD:
            raise ValueError(f"unknown reward function {name!r} in {spec!r}; choose from: "
                             f"{', '.join([*REWARDS, LEARNED_REWARD])}")
        try:
            weights[name] = float(value) if eq else 1.0
        except ValueError:
            raise ValueError(f"weight of reward {name!r} must be a number, got {value!r}") from None
    if not weights:
        raise ValueError("at least one reward function is needed, e.g. 'correct=1.0'")
    return weights


def reward_functions(weights: dict[str, float], reward_model: str = "") -> dict[str, RewardFn]:
    """The callable for each named reward; `rm` loads the reward model at `reward_model`."""
    fns: dict[str, RewardFn] = {}
    for name in weights:
        if name == LEARNED_REWARD:
            if not reward_model:
                raise ValueError("reward 'rm' needs reward_model: the directory of a trained reward model")
            from lmpo.envs.reward_model import RewardModelReward

            fns[name] = RewardModelReward(reward_model)
        else:
            fns[name] = REWARDS[name]
    return fns
