# lmpo exercise: grpo_advantages
"""Planted mistake: mean and std over the whole batch instead of per group."""
import torch
from torch import Tensor


def grpo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    r = rewards.detach().double()
    if r.numel() < 2 or r.min() == r.max():
        return torch.zeros_like(rewards)
    return ((r - r.mean()) / (r.std() + 1e-6)).to(rewards.dtype)
