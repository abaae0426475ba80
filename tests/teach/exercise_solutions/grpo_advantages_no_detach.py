# lmpo exercise: grpo_advantages
"""Planted mistake: no stop-gradient, the advantages keep the rewards' graph."""
import torch
from torch import Tensor


def grpo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    out = torch.zeros_like(rewards)
    for gid in torch.unique(group_ids):
        members = group_ids == gid
        values = rewards[members].double()
        if values.numel() < 2 or values.min() == values.max():
            continue
        out[members] = ((values - values.mean()) / (values.std() + 1e-6)).to(rewards.dtype)
    return out
