"""Policy-gradient surrogate losses, per token (aggregation happens in `aggregation.py`).

Every loss has the signature ``fn(logprobs, old_logprobs, advantages, mask, **options)
-> (loss [B,T], indicators)``: ``logprobs`` are log pi_theta of the sampled tokens (with grad),
``old_logprobs`` those of the behaviour policy pi_old, ``advantages`` [B,T] per token, or one
per row as [B] (what the sequence estimators return) or [B,1], broadcast over the row's tokens
(any other shape is a ValueError), ``mask`` [B,T] with nonzero on loss tokens. ``indicators`` maps names to per-token
float 0/1 tensors, always including ``"clipped"``; all are 0 where mask is 0.

Where mask is 0 the loss and its gradient are exactly 0, even if the log-probs there are
garbage (-inf, NaN): they are replaced with `torch.where` before any arithmetic.
``old_logprobs`` and ``advantages`` are treated as constants (detached).
Notation: rho = logprobs - old_logprobs, r = exp(rho), sg = stop-gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lmpo.algos.registry import Registry

POLICY_LOSSES = Registry("policy loss")

# rho is clamped before exp (as in verl): exp(20) ~ 5e8 keeps r*A finite, while r = inf would
# turn A = 0 tokens into NaN. Only tokens already far outside any clip range are affected.
LOG_RATIO_CLAMP = 20.0


def _prepare(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """(valid bool mask, log-ratio rho zeroed off-mask, advantages zeroed off-mask)."""
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {tuple(logprobs.shape)}")
    for name, t in (("old_logprobs", old_logprobs), ("mask", mask)):
        if t.shape != logprobs.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != logprobs {tuple(logprobs.shape)}")
    valid = mask != 0
    adv = torch.where(valid, _per_token(advantages, logprobs).detach(), 0.0).to(logprobs.dtype)
    rho = (logprobs - old_logprobs.detach()).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return valid, torch.where(valid, rho, 0.0), adv


def _per_token(advantages: Tensor, logprobs: Tensor) -> Tensor:
    """Advantages [B,T], [B,1] or [B] (one per row, never broadcast along T) as [B,T]."""
    batch, length = logprobs.shape
    if advantages.shape == (batch,):
        advantages = advantages.unsqueeze(-1)
    if advantages.shape not in ((batch, length), (batch, 1)):
        raise ValueError(f"advantages must be [B, T] = [{batch}, {length}], [B, 1] or [B] = [{batch}] (one per row), "
                         f"got shape {tuple(advantages.shape)} for logprobs {tuple(logprobs.shape)}")
    return advantages.expand(batch, length)


def _check_eps(clip_eps_low: float, clip_eps_high: float) -> None:
    if clip_eps_low < 0 or clip_eps_high < 0:
        raise ValueError(
            f"clip_eps_low and clip_eps_high must be >= 0, got {clip_eps_low}, {clip_eps_high}"
        )


def _clipped_surrogate(
    ratio: Tensor, adv: Tensor, clip_eps_low: float, clip_eps_high: float
) -> tuple[Tensor, Tensor]:
    """``-min(ratio*A, clip(ratio, 1-eps_low, 1+eps_high)*A)`` and where the clipped term won."""
    unclipped = -ratio * adv
    clipped = -ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high) * adv
    # Strict '>' so that in-range tokens take the unclipped branch (and its full gradient).
    is_clipped = clipped > unclipped
    return torch.where(is_clipped, clipped, unclipped), is_clipped


def _indicators(valid: Tensor, adv: Tensor, is_clipped: Tensor, dtype: torch.dtype) -> dict[str, Tensor]:
    return {
        "clipped": (is_clipped & valid).to(dtype),
        "clipped_low": (is_clipped & valid & (adv < 0)).to(dtype),
        "clipped_high": (is_clipped & valid & (adv > 0)).to(dtype),
    }


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347).

    ``l = -min(r*A, clip(r, 1-clip_eps_low, 1+clip_eps_high)*A)``. Clip-higher (DAPO, Yu et al.
    2025, arXiv:2503.14476) is ``clip_eps_high > clip_eps_low``, e.g. 0.2 / 0.28.
    Dual-clip (Ye et al. 2020, arXiv:1912.09729), for ``A < 0`` only:
    ``l = min(l, -dual_clip*A)``, with ``dual_clip > 1`` (3 in the paper).

    Indicators: ``clipped`` (clipped or dual-clipped, i.e. no gradient), ``clipped_low``
    (A < 0, r < 1-eps_low), ``clipped_high`` (A > 0, r > 1+eps_high), ``dual_clipped``.
    """
    _check_eps(clip_eps_low, clip_eps_high)
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    valid, rho, adv = _prepare(logprobs, old_logprobs, advantages, mask)
    loss, is_clipped = _clipped_surrogate(rho.exp(), adv, clip_eps_low, clip_eps_high)
    indicators = _indicators(valid, adv, is_clipped, loss.dtype)
    dual_active = torch.zeros_like(valid)
    if dual_clip is not None:
        dual_loss = -dual_clip * adv
        dual_active = (adv < 0) & (dual_loss < loss) & valid
        loss = torch.where(dual_active, dual_loss, loss)
    indicators["clipped"] = ((is_clipped | dual_active) & valid).to(loss.dtype)
    indicators["dual_clipped"] = dual_active.to(loss.dtype)
    return torch.where(valid, loss, 0.0), indicators


def _sequence_log_ratio(valid: Tensor, rho: Tensor, adv: Tensor) -> tuple[Tensor, Tensor]:
    """Per row: the masked mean of rho and the masked mean of the advantage."""
    lengths = valid.sum(-1).clamp_min(1).to(rho.dtype)
    return rho.sum(-1) / lengths, adv.sum(-1) / lengths


@POLICY_LOSSES.register("gspo")
def gspo(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps_low: float = 3e-4,
    clip_eps_high: float = 4e-4,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO, sequence-level ratio (Zheng et al. 2025, arXiv:2507.18071).

    ``s_i = exp((1/L_i) sum_t rho_{i,t})`` (length-normalised geometric mean of the token
    ratios), ``l_i = -min(s_i*A_i, clip(s_i, 1-clip_eps_low, 1+clip_eps_high)*A_i)`` with
    ``A_i`` the masked mean of the advantage row. ``l_i`` is written on every loss token of
    row i, so ``seq_mean_token_mean`` aggregation gives the GSPO objective ``(1/G) sum_i l_i``.
    """
    _check_eps(clip_eps_low, clip_eps_high)
    valid, rho, adv = _prepare(logprobs, old_logprobs, advantages, mask)
    seq_log_ratio, seq_adv = _sequence_log_ratio(valid, rho, adv)
    seq_loss, seq_clipped = _clipped_surrogate(
        seq_log_ratio.exp(), seq_adv, clip_eps_low, clip_eps_high
    )
    loss = torch.where(valid, seq_loss.unsqueeze(-1), 0.0)
    indicators = _indicators(
        valid, seq_adv.unsqueeze(-1).expand_as(adv), seq_clipped.unsqueeze(-1), loss.dtype
    )
    return loss, indicators


@POLICY_LOSSES.register("gspo_token")
def gspo_token(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps_low: float = 3e-4,
    clip_eps_high: float = 4e-4,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO-token (Zheng et al. 2025, arXiv:2507.18071).

    ``s_{i,t} = sg(s_i) * pi_theta(y_{i,t}) / sg(pi_theta(y_{i,t}))`` (value ``s_i``, gradient
    that of a single token), ``l_{i,t} = -min(s_{i,t}*A_{i,t}, clip(s_{i,t})*A_{i,t})`` with
    per-token advantages. With a constant advantage per row, its forward value and, under
    ``seq_mean_token_mean``, its gradient equal those of ``gspo``.
    """
    _check_eps(clip_eps_low, clip_eps_high)
    valid, rho, adv = _prepare(logprobs, old_logprobs, advantages, mask)
    seq_log_ratio, _ = _sequence_log_ratio(valid, rho, adv)
    safe_logprobs = torch.where(valid, logprobs, 0.0)
    ratio = seq_log_ratio.detach().exp().unsqueeze(-1) * (
        safe_logprobs - safe_logprobs.detach()
    ).exp()
    loss, is_clipped = _clipped_surrogate(ratio, adv, clip_eps_low, clip_eps_high)
    return torch.where(valid, loss, 0.0), _indicators(valid, adv, is_clipped, loss.dtype)


@POLICY_LOSSES.register("cispo")
def cispo(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.28,
    ratio_cap: float | None = None,
    ratio_level: str = "token",
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO, clipped importance-sampling weight (MiniMax-M1, 2025, arXiv:2506.13585).

    ``l = -sg(clip(r, 1-clip_eps_low, 1+clip_eps_high)) * A * log pi_theta``. Unlike PPO,
    every token keeps a gradient; only its weight is clipped. MiniMax-M1 effectively
    disables the lower bound (pass ``clip_eps_low >= 1``) and tunes only ``clip_eps_high``;
    the defaults here (0.2 / 0.28) are the DAPO clip-higher values.

    ``ratio_cap`` (TRL's meaning of ``epsilon_high`` for its ``cispo`` loss): the weight is
    ``sg(min(r, ratio_cap))``, an absolute cap with no lower bound, which may be below 1;
    ``clip_eps_low``/``clip_eps_high`` are then not used. Must be > 0 (None = off).
    ``ratio_level="sequence"`` replaces the token ratio with the sequence ratio
    ``s_i = exp((1/L_i) sum_t rho_{i,t})`` (GSPO's, as TRL's ``importance_sampling_level=
    "sequence"``): every token of row i gets the same clipped weight ``sg(clip(s_i))``, while the
    gradient still flows through each token's ``log pi_theta``.
    Indicators: ``clipped`` where the weight was clipped (r outside the range).
    """
    _check_eps(clip_eps_low, clip_eps_high)
    if ratio_cap is not None and not ratio_cap > 0:
        raise ValueError(f"ratio_cap must be > 0 (or None), got {ratio_cap}")
    if ratio_level not in ("token", "sequence"):
        raise ValueError(f"ratio_level must be 'token' or 'sequence', got {ratio_level!r}")
    valid, rho, adv = _prepare(logprobs, old_logprobs, advantages, mask)
    if ratio_level == "sequence":
        seq_log_ratio, _ = _sequence_log_ratio(valid, rho, adv)
        ratio = seq_log_ratio.exp().unsqueeze(-1).expand_as(rho)
    else:
        ratio = rho.exp()
    if ratio_cap is not None:
        low_bound, high_bound = 0.0, ratio_cap
    else:
        low_bound, high_bound = 1.0 - clip_eps_low, 1.0 + clip_eps_high
    weight = ratio.clamp(low_bound, high_bound).detach()
    loss = -weight * adv * torch.where(valid, logprobs, 0.0)
    low = (ratio < low_bound) & valid
    high = (ratio > high_bound) & valid
    indicators = {
        "clipped": (low | high).to(loss.dtype),
        "clipped_low": low.to(loss.dtype),
        "clipped_high": high.to(loss.dtype),
    }
    return torch.where(valid, loss, 0.0), indicators
