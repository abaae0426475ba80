# lmpo exercise: grpo_advantages
"""Planted mistake: assumes the batch is contiguous blocks of equal size (reshape by group count)."""
import torch
from torch import Tensor


def grpo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    groups = len(torch.unique(group_ids))
    r = rewards.detach().double().reshape(groups, -1)
    mean, std = r.mean(-1, keepdim=True), r.std(-1, keepdim=True)
    flat = (r.max(-1, keepdim=True).values == r.min(-1, keepdim=True).values)
    out = torch.where(flat, 0.0, (r - mean) / (std + 1e-6))
    return out.reshape(-1).to(rewards.dtype)
