"""Loss aggregation: how per-token losses [B,T] become one scalar.

Every mode has the signature ``fn(loss, mask, *, num_sequences=None, num_tokens=None,
max_len=None) -> scalar``. ``num_sequences`` / ``num_tokens`` are the counts of the whole
global batch (all micro-batches, all data-parallel ranks), so that summing the per-micro-batch
results gives the loss, and the gradient, of the whole batch whatever the split. When None,
this batch's own counts are used. A "sequence" is a row with at least one loss token: rows
that are fully masked (padding rows, completions masked out by overlong filtering)
contribute nothing and are not counted. A zero denominator yields 0, never NaN (an empty
mask; a given count that is negative, or 0 while the mask has loss tokens, is a ValueError).
Positions with mask 0 are excluded with `torch.where`, so NaN/inf there cannot leak in.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lmpo.algos.registry import Registry

AGGREGATIONS = Registry("loss aggregation")


def _check(loss: Tensor, mask: Tensor) -> Tensor:
    if loss.shape != mask.shape:
        raise ValueError(f"loss shape {tuple(loss.shape)} != mask shape {tuple(mask.shape)}")
    return mask != 0


def _safe_denominator(value: float | Tensor, like: Tensor) -> Tensor:
    denom = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    return torch.where(denom > 0, denom, torch.ones_like(denom))


def _count(given: float | Tensor | None, own: Tensor, valid: Tensor, name: str) -> float | Tensor:
    """The global count ``given`` by the caller, else this batch's ``own``. A given count is > 0,
    or 0 with an empty mask (the result is then 0): anything else is a caller's bug."""
    if given is None:
        return own
    if given < 0 or (given == 0 and valid.any()):
        raise ValueError(f"{name} must be > 0 (or 0 when the mask is empty), got {given} "
                         f"with {int(valid.sum())} loss tokens in the mask")
    return given


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``sum(x * mask) / sum(mask)`` over all elements (``dim=None``) or along ``dim``.

    Positions with mask 0 are ignored (even if NaN); an empty selection gives 0.
    """
    valid = mask != 0
    values = torch.where(valid, x, torch.zeros((), dtype=x.dtype, device=x.device))
    if dim is None:
        total, count = values.sum(), valid.sum()
    else:
        total, count = values.sum(dim), valid.sum(dim)
    return total / count.clamp_min(1).to(total.dtype)


@AGGREGATIONS.register("token_mean")
def token_mean(
    loss: Tensor,
    mask: Tensor,
    *,
    num_sequences: int | None = None,
    num_tokens: float | None = None,
    max_len: int | None = None,
) -> Tensor:
    """Token mean over the batch (DAPO, Yu et al. 2025, arXiv:2503.14476).

    ``sum_{i,t} l_{i,t} * mask_{i,t} / num_tokens``, ``num_tokens = sum_i L_i`` by default.
    """
    valid = _check(loss, mask)
    total = torch.where(valid, loss, 0.0).sum()
    return total / _safe_denominator(_count(num_tokens, valid.sum(), valid, "num_tokens"), total)


def _num_sequences(valid: Tensor, num_sequences: int | None, like: Tensor) -> Tensor:
    return _safe_denominator(_count(num_sequences, valid.any(-1).sum(), valid, "num_sequences"), like)


@AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean(
    loss: Tensor,
    mask: Tensor,
    *,
    num_sequences: int | None = None,
    num_tokens: float | None = None,
    max_len: int | None = None,
) -> Tensor:
    """Sequence mean of token means (original GRPO, Shao et al. 2024, arXiv:2402.03300).

    ``(1/num_sequences) sum_i (1/L_i) sum_t l_{i,t} * mask_{i,t}``; rows with ``L_i = 0``
    contribute 0. ``num_tokens`` is accepted for a uniform signature and ignored.
    """
    valid = _check(loss, mask)
    per_token = torch.where(valid, loss, 0.0)
    lengths = valid.sum(-1).clamp_min(1).to(per_token.dtype)
    per_sequence = per_token.sum(-1) / lengths
    return per_sequence.sum() / _num_sequences(valid, num_sequences, per_sequence)


@AGGREGATIONS.register("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(
    loss: Tensor,
    mask: Tensor,
    *,
    num_sequences: int | None = None,
    num_tokens: float | None = None,
    max_len: int | None = None,
) -> Tensor:
    """Token sum over a constant (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783).

    ``sum_{i,t} l_{i,t} * mask_{i,t} / (num_sequences * max_len)``, ``max_len`` the maximum
    completion length (a constant, required). ``num_tokens`` is accepted and ignored.
    """
    if max_len is None:
        raise ValueError("seq_mean_token_sum_norm needs max_len (the max completion length)")
    if max_len <= 0:
        raise ValueError(f"max_len must be > 0, got {max_len}")
    valid = _check(loss, mask)
    total = torch.where(valid, loss, 0.0).sum()
    return total / (_num_sequences(valid, num_sequences, total) * max_len)
