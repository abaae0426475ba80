# lmpo exercise: bradley_terry_loss
"""Planted mistake: r_l - r_w."""
import torch
import torch.nn.functional as F
from torch import Tensor


def bradley_terry_loss(chosen_scores: Tensor, rejected_scores: Tensor, margin: float | Tensor = 0.0) -> Tensor:
    if isinstance(margin, torch.Tensor):
        margin = margin.detach()
    return -F.logsigmoid(rejected_scores - chosen_scores - margin)
