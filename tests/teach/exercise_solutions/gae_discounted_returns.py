# lmpo exercise: gae
"""Planted mistake: returns are the discounted reward sums, not A + V."""
import torch
from torch import Tensor


def gae(token_rewards: Tensor, mask: Tensor, *, values: Tensor, gamma: float = 1.0,
        lam: float = 1.0) -> tuple[Tensor, Tensor]:
    r, v = token_rewards.detach().double(), values.detach().double()
    advantages, returns = torch.zeros_like(r), torch.zeros_like(r)
    for b in range(r.shape[0]):
        running, next_value, ret = 0.0, 0.0, 0.0
        for t in reversed(range(r.shape[1])):
            if mask[b, t] == 0:
                continue
            delta = r[b, t] + gamma * next_value - v[b, t]
            running = delta + gamma * lam * running
            ret = r[b, t] + gamma * ret
            advantages[b, t], returns[b, t], next_value = running, ret, v[b, t]
    return advantages.to(token_rewards.dtype), returns.to(token_rewards.dtype)
