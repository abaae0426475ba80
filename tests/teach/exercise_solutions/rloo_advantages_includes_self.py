# lmpo exercise: rloo_advantages
"""Planted mistake: the baseline is the mean of the whole group, the completion included."""
import torch
from torch import Tensor


def rloo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    r = rewards.detach().double()
    out = torch.zeros_like(r)
    for gid in torch.unique(group_ids):
        members = group_ids == gid
        values = r[members]
        if values.numel() < 2 or values.min() == values.max():
            continue
        out[members] = values - values.mean()
    return out.to(rewards.dtype)
