# lmpo exercise: gae
"""Planted mistake: λ in place of γ in δ (δ_t = r_t + λ·V_{t+1} − V_t)."""
import torch
from torch import Tensor


def gae(token_rewards: Tensor, mask: Tensor, *, values: Tensor, gamma: float = 1.0,
        lam: float = 1.0) -> tuple[Tensor, Tensor]:
    r, v = token_rewards.detach().double(), values.detach().double()
    advantages = torch.zeros_like(r)
    for b in range(r.shape[0]):
        running, next_value = 0.0, 0.0
        for t in reversed(range(r.shape[1])):
            if mask[b, t] == 0:
                continue
            delta = r[b, t] + lam * next_value - v[b, t]
            running = delta + gamma * lam * running
            advantages[b, t] = running
            next_value = v[b, t]
    valid = mask != 0
    returns = torch.where(valid, advantages + v, 0.0)
    return advantages.to(token_rewards.dtype), returns.to(token_rewards.dtype)
