# lmpo exercise: grpo_advantages
"""Planted mistake: right advantages, but the caller's group ids are zeroed in place afterwards."""
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
        out[members] = (values - values.mean()) / (values.std(unbiased=True) + 1e-6)
    group_ids.zero_()
    return out.to(rewards.dtype)
