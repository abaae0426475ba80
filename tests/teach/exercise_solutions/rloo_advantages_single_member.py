# lmpo exercise: rloo_advantages
"""Planted mistake: divides by G-1 also for a group of one completion."""
import torch
from torch import Tensor


def rloo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    r = rewards.detach().double()
    out = torch.zeros_like(r)
    for gid in torch.unique(group_ids):
        members = group_ids == gid
        values = r[members]
        n = values.numel()
        if n > 1 and values.min() == values.max():
            continue
        out[members] = values - (values.sum() - values) / (n - 1)
    return out.to(rewards.dtype)
