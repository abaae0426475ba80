# lmpo exercise: grpo_advantages
"""Planted mistake: the advantages are written into the caller's rewards, which are returned."""
import torch
from torch import Tensor


def grpo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    with torch.no_grad():
        for gid in torch.unique(group_ids):
            members = group_ids == gid
            values = rewards[members]
            if values.numel() < 2 or values.min() == values.max():
                rewards[members] = 0
                continue
            rewards[members] = (values - values.mean()) / (values.std() + 1e-6)
    return rewards
