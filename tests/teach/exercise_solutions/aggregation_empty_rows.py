# lmpo exercise: aggregation
"""Planted mistake: every row counts as a sequence, even a fully masked one."""
import torch
from torch import Tensor


def seq_mean_token_mean(loss: Tensor, mask: Tensor) -> Tensor:
    valid = mask != 0
    per_sequence = torch.where(valid, loss, 0.0).sum(-1) / valid.sum(-1).clamp_min(1)
    return per_sequence.mean()
