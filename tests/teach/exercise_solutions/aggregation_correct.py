# lmpo exercise: aggregation
"""A correct solution: mean over each sequence's own tokens, then over non-empty sequences."""
import torch
from torch import Tensor


def seq_mean_token_mean(loss: Tensor, mask: Tensor) -> Tensor:
    valid = mask != 0
    per_token = torch.where(valid, loss, 0.0)
    lengths = valid.sum(-1)
    per_sequence = per_token.sum(-1) / lengths.clamp_min(1)
    sequences = (lengths > 0).sum().clamp_min(1)
    return per_sequence.sum() / sequences
