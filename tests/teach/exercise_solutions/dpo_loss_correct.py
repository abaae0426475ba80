# lmpo exercise: dpo_loss
"""A correct solution: reference log-probs detached, logsigmoid for stability."""
import torch.nn.functional as F
from torch import Tensor


def dpo_loss(chosen_logps: Tensor, rejected_logps: Tensor, ref_chosen_logps: Tensor,
             ref_rejected_logps: Tensor, beta: float = 0.1) -> Tensor:
    chosen = chosen_logps - ref_chosen_logps.detach()
    rejected = rejected_logps - ref_rejected_logps.detach()
    return -F.logsigmoid(beta * (chosen - rejected))
