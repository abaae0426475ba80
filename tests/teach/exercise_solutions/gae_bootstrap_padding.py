# lmpo exercise: gae
"""Planted mistake: runs over every position, so the last token bootstraps from the padding's value."""
import torch
from torch import Tensor


def gae(token_rewards: Tensor, mask: Tensor, *, values: Tensor, gamma: float = 1.0,
        lam: float = 1.0) -> tuple[Tensor, Tensor]:
    r, v = token_rewards.detach().double(), values.detach().double()
    advantages = torch.zeros_like(r)
    running, next_value = torch.zeros(r.shape[0], dtype=r.dtype), torch.zeros(r.shape[0], dtype=r.dtype)
    for t in reversed(range(r.shape[1])):
        delta = r[:, t] + gamma * next_value - v[:, t]
        running = delta + gamma * lam * running
        advantages[:, t] = running
        next_value = v[:, t]
    valid = mask != 0
    advantages = torch.where(valid, advantages, 0.0)
    returns = torch.where(valid, advantages + v, 0.0)
    return advantages.to(token_rewards.dtype), returns.to(token_rewards.dtype)
