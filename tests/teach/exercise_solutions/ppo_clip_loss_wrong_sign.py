# lmpo exercise: ppo_clip_loss
"""Planted mistake: returns the surrogate itself (to be maximised) instead of the loss."""
import torch
from torch import Tensor


def ppo_clip_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                  clip_eps_low: float = 0.2, clip_eps_high: float = 0.2) -> Tensor:
    valid = mask != 0
    ratio = torch.where(valid, logprobs - old_logprobs.detach(), 0.0).exp()
    adv = torch.where(valid, advantages.detach(), 0.0)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps_low, 1 + clip_eps_high) * adv)
    return torch.where(valid, surrogate, 0.0)
