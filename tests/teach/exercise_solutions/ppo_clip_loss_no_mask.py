# lmpo exercise: ppo_clip_loss
"""Planted mistake: the mask is never applied."""
import torch
from torch import Tensor


def ppo_clip_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                  clip_eps_low: float = 0.2, clip_eps_high: float = 0.2) -> Tensor:
    ratio = (logprobs - old_logprobs.detach()).exp()
    adv = advantages.detach()
    return -torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps_low, 1 + clip_eps_high) * adv)
