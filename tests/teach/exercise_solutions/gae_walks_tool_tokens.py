# lmpo exercise: gae
"""Planted mistake: the recursion walks through the tool tokens (mask 0 inside the row) as time steps."""
import torch
from torch import Tensor


def gae(token_rewards: Tensor, mask: Tensor, *, values: Tensor, gamma: float = 1.0,
        lam: float = 1.0) -> tuple[Tensor, Tensor]:
    r, v, m = token_rewards.detach(), values.detach(), mask.bool()
    adv, ret = torch.zeros_like(r), torch.zeros_like(r)
    for b in range(r.shape[0]):
        idx = [t for t in range(r.shape[1]) if m[b, t]]
        if not idx:
            continue
        next_v, next_a = 0.0, 0.0
        for t in range(idx[-1], idx[0] - 1, -1):
            a = r[b, t] + gamma * next_v - v[b, t] + gamma * lam * next_a
            adv[b, t], ret[b, t] = a, a + v[b, t]
            next_v, next_a = v[b, t], a
    return adv * m, ret * m
