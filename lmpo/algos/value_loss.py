"""Critic loss for PPO, per token (aggregation happens in `aggregation.py`)."""

from __future__ import annotations

import torch
from torch import Tensor


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip_eps_value: float | None = 0.2,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped value loss (Schulman et al. 2017, arXiv:1707.06347; as in InstructGPT,
    Ouyang et al. 2022, arXiv:2203.02155, and OpenAI baselines' ppo2).

    ``l = 1/2 * max((V - G)^2, (clip(V, V_old - eps_v, V_old + eps_v) - G)^2)`` per token,
    [B,T]; ``clip_eps_value=None`` gives ``1/2 * (V - G)^2``. ``values`` V carry the gradient;
    ``old_values`` and ``returns`` G are constants (detached). Where mask is 0 the loss and
    its gradient are exactly 0, even if the inputs there are NaN.
    Indicators: ``clipped`` (1.0 where the clipped term is strictly larger, i.e. no gradient).
    """
    if values.dim() != 2:
        raise ValueError(f"values must be [B, T], got shape {tuple(values.shape)}")
    for name, t in (("old_values", old_values), ("returns", returns), ("mask", mask)):
        if t.shape != values.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != values {tuple(values.shape)}")
    if clip_eps_value is not None and clip_eps_value < 0:
        raise ValueError(f"clip_eps_value must be >= 0 or None, got {clip_eps_value}")
    valid = mask != 0
    v = torch.where(valid, values, 0.0)
    target = torch.where(valid, returns.detach(), 0.0).to(v.dtype)
    unclipped = 0.5 * (v - target).square()
    if clip_eps_value is None:
        loss, is_clipped = unclipped, torch.zeros_like(valid)
    else:
        old = torch.where(valid, old_values.detach(), 0.0).to(v.dtype)
        v_clipped = torch.minimum(torch.maximum(v, old - clip_eps_value), old + clip_eps_value)
        clipped = 0.5 * (v_clipped - target).square()
        # Strict '>' so that in-range tokens take the unclipped branch (and its full gradient).
        is_clipped = (clipped > unclipped) & valid
        loss = torch.where(is_clipped, clipped, unclipped)
    return torch.where(valid, loss, 0.0), {"clipped": is_clipped.to(loss.dtype)}
