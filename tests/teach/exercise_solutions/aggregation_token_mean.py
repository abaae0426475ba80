# lmpo exercise: aggregation
"""Planted mistake: token mean over the batch (DAPO's) instead of the sequence mean of token means."""
import torch
from torch import Tensor


def seq_mean_token_mean(loss: Tensor, mask: Tensor) -> Tensor:
    valid = mask != 0
    return torch.where(valid, loss, 0.0).sum() / valid.sum().clamp_min(1)
