# lmpo exercise: grpo_advantages
"""Planted mistake: population std (divide by N) instead of lmpo's sample std (N-1)."""
import torch
from torch import Tensor


def grpo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    r = rewards.detach().double()
    out = torch.zeros_like(r)
    for gid in torch.unique(group_ids):
        members = group_ids == gid
        values = r[members]
        if values.numel() < 2 or values.min() == values.max():
            continue
        out[members] = (values - values.mean()) / (values.std(unbiased=False) + 1e-6)
    return out.to(rewards.dtype)
