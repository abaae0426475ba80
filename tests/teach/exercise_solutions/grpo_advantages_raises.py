# lmpo exercise: grpo_advantages
"""Planted mistake: a bug that raises (indexing a 1-D tensor with two indices)."""
from torch import Tensor


def grpo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    centered = rewards - rewards.mean()
    return centered[:, 0]
