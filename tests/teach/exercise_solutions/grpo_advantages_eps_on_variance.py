# lmpo exercise: grpo_advantages
"""Planted mistake: eps added to the variance, not to the std."""
import torch
from torch import Tensor


def grpo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    r = rewards.double()
    out = torch.zeros_like(r)
    for g in torch.unique(group_ids):
        m = group_ids == g
        x = r[m]
        if x.numel() < 2 or torch.all(x == x[0]):
            continue
        out[m] = (x - x.mean()) / torch.sqrt(x.var() + 1e-6)
    return out.to(rewards.dtype)
