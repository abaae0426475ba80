# lmpo exercise: grpo_advantages
"""Planted mistake: the textbook formula with no special case for all-equal groups, in float32."""
import torch
from torch import Tensor


def grpo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    r = rewards.detach()
    out = torch.zeros_like(r)
    for gid in torch.unique(group_ids):
        members = group_ids == gid
        values = r[members]
        std = values.std() if values.numel() > 1 else torch.zeros(())
        out[members] = (values - values.mean()) / (std + 1e-6)
    return out
