# lmpo exercise: ppo_clip_loss
"""Planted mistake: masks the loss with torch.where but takes exp of the raw log-ratio, so -inf log-probs at
padding give exp(NaN): the values are right, the gradient is NaN."""
import torch
from torch import Tensor


def ppo_clip_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                  clip_eps_low: float = 0.2, clip_eps_high: float = 0.2) -> Tensor:
    ratio = (logprobs - old_logprobs.detach()).exp()
    adv = advantages.detach()
    loss = -torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps_low, 1 + clip_eps_high) * adv)
    return torch.where(mask.bool(), loss, torch.zeros_like(loss))
