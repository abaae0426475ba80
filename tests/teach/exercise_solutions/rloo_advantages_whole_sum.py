# lmpo exercise: rloo_advantages
"""Planted mistake: the baseline divides the sum of the whole group, the completion included, by G−1."""
import torch
from torch import Tensor


def rloo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    r = rewards.detach().double()
    out = torch.zeros_like(r)
    for gid in torch.unique(group_ids):
        members = group_ids == gid
        values = r[members]
        if values.numel() > 1:
            out[members] = values - values.sum() / (values.numel() - 1)
    return out.to(rewards.dtype)
