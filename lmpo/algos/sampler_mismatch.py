"""Sampler/trainer mismatch: truncated importance sampling (TIS) and the mismatch KL.

When the tokens are sampled by an inference engine (vLLM, in bf16, with its own kernels) and
trained by another forward pass (the trainer's), the two assign the same token different
log-probs even with identical weights. The PPO ratio must then use the trainer's own
recomputed log-probs as pi_old, and each token's loss is reweighted by the truncated
importance weight of trainer over sampler (Yao et al. 2025, "Your Efficient RL Framework
Secretly Brings You Off-Policy RL Training")::

    w_t = min( exp(log pi_trainer(y_t) - log pi_sampler(y_t)), C )      (detached)

Notation: ``trainer_logprobs`` = log pi_trainer(y_t), ``sampler_logprobs`` = log pi_sampler(y_t)
of the sampled tokens, ``mask`` [B,T] nonzero on loss tokens. Off the mask everything is 0,
even where the log-probs are garbage (-inf, NaN): they are replaced before any arithmetic.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from lmpo.algos.kl import k1, k3


def _log_ratio(trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(valid bool mask, ``log pi_trainer - log pi_sampler`` detached and 0 off the mask)."""
    if trainer_logprobs.shape != sampler_logprobs.shape or trainer_logprobs.shape != mask.shape:
        raise ValueError(f"shapes differ: trainer {tuple(trainer_logprobs.shape)}, sampler "
                         f"{tuple(sampler_logprobs.shape)}, mask {tuple(mask.shape)}")
    valid = mask != 0
    rho = trainer_logprobs.detach().float() - sampler_logprobs.detach().float()
    return valid, torch.where(valid, rho, 0.0)


def truncated_importance_weights(trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor,
                                 cap: float = 2.0) -> Tensor:
    """Per-token TIS weights ``min(exp(log pi_trainer - log pi_sampler), cap)``, detached, fp32,
    0 off the mask (so the weights double as a weighted loss mask).

    Equal log-probs give weights of exactly 1. Only the upper side is truncated: a token the
    trainer finds less likely than the sampler did gets a weight below 1, as importance
    sampling requires; one it finds far more likely is capped, bounding the variance."""
    if not cap > 0:
        raise ValueError(f"cap must be > 0, got {cap}")
    valid, rho = _log_ratio(trainer_logprobs, sampler_logprobs, mask)
    # clamping the log-ratio at log(cap) before exp() gives exactly `cap` and never overflows
    weights = rho.clamp(max=math.log(cap)).exp()
    return torch.where(valid, weights, 0.0)


def tis_clipped(trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, cap: float = 2.0) -> Tensor:
    """1.0 where a loss token's importance ratio exceeded `cap` (its weight was truncated), else 0."""
    valid, rho = _log_ratio(trainer_logprobs, sampler_logprobs, mask)
    return (valid & (rho > math.log(cap))).float()


class MismatchKL(NamedTuple):
    """Token-mean estimates of KL(pi_sampler || pi_trainer) over the loss tokens (scalars)."""

    k3: Tensor
    """``mean(r - 1 - log r)`` with ``r = pi_trainer / pi_sampler``: unbiased, >= 0 per token."""
    k1: Tensor
    """``mean(log pi_sampler - log pi_trainer)``: unbiased, per token of either sign."""


def mismatch_kl(trainer_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> MismatchKL:
    """KL(pi_sampler || pi_trainer) from tokens sampled by pi_sampler, averaged over the mask.

    With ``r_t = exp(log pi_trainer(y_t) - log pi_sampler(y_t))`` (Schulman's estimators, the
    sampler playing pi_theta and the trainer pi_ref)::

        k1 = mean_t( -log r_t )            k3 = mean_t( r_t - 1 - log r_t )

    Both are exactly 0 when the log-probs are equal; an empty mask gives 0."""
    valid, rho = _log_ratio(trainer_logprobs, sampler_logprobs, mask)
    sampler = torch.zeros_like(rho)  # only the difference matters: log pi_sampler = 0, log pi_trainer = rho
    count = valid.sum().clamp(min=1).float()
    per_k3 = torch.where(valid, k3(sampler, rho), 0.0)
    per_k1 = torch.where(valid, k1(sampler, rho), 0.0)
    return MismatchKL(per_k3.sum() / count, per_k1.sum() / count)
