# lmpo exercise: aggregation
"""Planted mistake: averages every position of each row, padding included."""
from torch import Tensor


def seq_mean_token_mean(loss: Tensor, mask: Tensor) -> Tensor:
    return loss.mean(-1).mean()
