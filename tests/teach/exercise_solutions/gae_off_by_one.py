# lmpo exercise: gae
"""Planted mistake: each token stores the advantage carried from the next loss token (A_{t+1}), the
last token its δ; the returns use the right A_t."""
import torch
from torch import Tensor


def gae(token_rewards: Tensor, mask: Tensor, *, values: Tensor, gamma: float = 1.0,
        lam: float = 1.0) -> tuple[Tensor, Tensor]:
    r, v = token_rewards.detach().double(), values.detach().double()
    advantages, returns = torch.zeros_like(r), torch.zeros_like(r)
    for b in range(r.shape[0]):
        next_value, next_advantage, last = 0.0, 0.0, True
        for t in reversed(range(r.shape[1])):
            if mask[b, t] == 0:
                continue
            delta = r[b, t] + gamma * next_value - v[b, t]
            running = delta + gamma * lam * next_advantage
            advantages[b, t] = delta if last else next_advantage
            returns[b, t] = running + v[b, t]
            next_value, next_advantage, last = v[b, t], running, False
    return advantages.to(token_rewards.dtype), returns.to(token_rewards.dtype)
