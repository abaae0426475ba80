# lmpo exercise: ppo_clip_loss
"""Planted mistake: the old log-probs are not detached (missing stop-gradient)."""
import torch
from torch import Tensor


def ppo_clip_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                  clip_eps_low: float = 0.2, clip_eps_high: float = 0.2) -> Tensor:
    valid = mask != 0
    ratio = torch.where(valid, logprobs - old_logprobs, 0.0).exp()
    adv = torch.where(valid, advantages.detach(), 0.0)
    loss = -torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps_low, 1 + clip_eps_high) * adv)
    return torch.where(valid, loss, 0.0)
