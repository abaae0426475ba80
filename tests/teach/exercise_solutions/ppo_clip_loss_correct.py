# lmpo exercise: ppo_clip_loss
"""A correct solution: pessimistic min of the two surrogates, masked with torch.where."""
import torch
from torch import Tensor


def ppo_clip_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                  clip_eps_low: float = 0.2, clip_eps_high: float = 0.2) -> Tensor:
    valid = mask != 0
    log_ratio = torch.where(valid, logprobs - old_logprobs.detach(), 0.0)
    ratio = log_ratio.exp()
    adv = torch.where(valid, advantages.detach(), 0.0)
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - clip_eps_low, 1 + clip_eps_high) * adv
    return torch.where(valid, -torch.minimum(unclipped, clipped), 0.0)
