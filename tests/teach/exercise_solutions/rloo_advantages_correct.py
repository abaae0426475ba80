# lmpo exercise: rloo_advantages
"""A correct solution: leave-one-out baseline, 0 for single-member and all-equal groups."""
import torch
from torch import Tensor


def rloo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    r = rewards.detach().double()
    out = torch.zeros_like(r)
    for gid in torch.unique(group_ids):
        members = group_ids == gid
        values = r[members]
        n = values.numel()
        if n < 2 or values.min() == values.max():
            continue
        baseline = (values.sum() - values) / (n - 1)
        out[members] = values - baseline
    return out.to(rewards.dtype)
