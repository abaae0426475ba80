# lmpo exercise: dpo_loss
"""Planted mistake: gradient flows into the reference log-probs."""
import torch.nn.functional as F
from torch import Tensor


def dpo_loss(chosen_logps: Tensor, rejected_logps: Tensor, ref_chosen_logps: Tensor,
             ref_rejected_logps: Tensor, beta: float = 0.1) -> Tensor:
    h = beta * ((chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps))
    return -F.logsigmoid(h)
