# lmpo exercise: ppo_clip_loss
"""Planted mistake: a correct loss, but the caller's mask is zeroed in place afterwards."""
import torch
from torch import Tensor


def ppo_clip_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                  clip_eps_low: float = 0.2, clip_eps_high: float = 0.2) -> Tensor:
    m = mask.bool()
    rho = torch.where(m, logprobs - old_logprobs.detach(), torch.zeros_like(logprobs)).clamp(-20, 20)
    r = rho.exp()
    a = torch.where(m, advantages.detach(), torch.zeros_like(advantages))
    loss = torch.maximum(-r * a, -r.clamp(1 - clip_eps_low, 1 + clip_eps_high) * a)
    out = torch.where(m, loss, torch.zeros_like(loss))
    mask.zero_()
    return out
