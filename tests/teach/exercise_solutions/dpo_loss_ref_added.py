# lmpo exercise: dpo_loss
"""Planted mistake: the reference log-probs are added instead of subtracted."""
import torch.nn.functional as F
from torch import Tensor


def dpo_loss(chosen_logps: Tensor, rejected_logps: Tensor, ref_chosen_logps: Tensor,
             ref_rejected_logps: Tensor, beta: float = 0.1) -> Tensor:
    h = beta * ((chosen_logps + ref_chosen_logps.detach()) - (rejected_logps + ref_rejected_logps.detach()))
    return -F.logsigmoid(h)
