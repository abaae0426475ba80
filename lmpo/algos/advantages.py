"""Outcome-reward advantage estimators: one scalar reward and one advantage per sequence.

Every estimator has the signature ``fn(rewards: Tensor[N], group_ids: Tensor[N], **options)
-> Tensor[N]``. A group is the set of completions sampled for one prompt; groups may have
different sizes and ``group_ids`` may be any integers (not necessarily contiguous or sorted).
Statistics are computed in float64 and the result is cast back to ``rewards.dtype`` when that is
floating point; integer or bool rewards (0/1 correctness) give advantages in the default float
dtype (float32), never truncated to integers.

A group whose rewards are all equal gets advantage exactly 0 for every member (it carries no
policy-gradient signal); this is enforced explicitly, because ``x - mean(x, x, x)`` is not
always exactly 0 in floating point and GRPO would then divide that rounding error by ~eps.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from lmpo.algos.registry import Registry

ADVANTAGES = Registry("advantage estimator")


def _check(rewards: Tensor, group_ids: Tensor) -> None:
    for name, t in (("rewards", rewards), ("group_ids", group_ids)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__} (wrap it in torch.tensor(...))")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if group_ids.shape != rewards.shape:
        raise ValueError(
            f"group_ids shape {tuple(group_ids.shape)} != rewards shape {tuple(rewards.shape)}"
        )
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got {group_ids.dtype}")


def _float_dtype(t: Tensor) -> torch.dtype:
    """The dtype of an advantage computed from `t`: its own if floating point, else the default float."""
    return t.dtype if t.dtype.is_floating_point else torch.get_default_dtype()


def _group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """Dense group index in [0, num_groups) per sequence (groups ordered by sorted id)."""
    unique_ids, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, unique_ids.numel()


def _group_sum(values: Tensor, index: Tensor, num_groups: int) -> Tensor:
    return torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(
        0, index, values
    )


def _group_stats(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(rewards as float64, group index per sequence, group sizes, group means), all float64."""
    _check(rewards, group_ids)
    r = rewards.detach().to(torch.float64)
    index, num_groups = _group_index(group_ids)
    counts = _group_sum(torch.ones_like(r), index, num_groups)
    means = _group_sum(r, index, num_groups) / counts.clamp_min(1.0)
    return r, index, counts, means


def _zero_variance(r: Tensor, index: Tensor, num_groups: int) -> Tensor:
    fill_hi = torch.full((num_groups,), float("inf"), dtype=r.dtype, device=r.device)
    fill_lo = torch.full((num_groups,), float("-inf"), dtype=r.dtype, device=r.device)
    group_min = fill_hi.scatter_reduce(0, index, r, reduce="amin")
    group_max = fill_lo.scatter_reduce(0, index, r, reduce="amax")
    return group_min == group_max


def _std(squared_dev_sum: Tensor, count: Tensor, std: str) -> Tensor:
    """Std from a sum of squared deviations; sample std of a single value is 0, not NaN."""
    denom = (count - 1.0) if std == "sample" else count
    return (squared_dev_sum / denom.clamp_min(1.0)).sqrt()


def group_means(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Per sequence, the mean reward of its group: ``mean_{j in group(i)} R_j`` (shape [N])."""
    _, index, _, means = _group_stats(rewards, group_ids)
    return means[index].to(_float_dtype(rewards))


def zero_variance_groups(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Bool [num_groups], True where all rewards of the group are equal.

    Groups are ordered by sorted group id (the order of ``torch.unique(group_ids)``).
    """
    _check(rewards, group_ids)
    index, num_groups = _group_index(group_ids)
    return _zero_variance(rewards.detach().to(torch.float64), index, num_groups)


def zero_variance_fraction(rewards: Tensor, group_ids: Tensor) -> float:
    """Fraction of groups whose rewards are all equal (no signal); 0.0 for an empty batch."""
    flags = zero_variance_groups(rewards, group_ids)
    return float(flags.float().mean()) if flags.numel() else 0.0


@ADVANTAGES.register("grpo")
def grpo(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    std: str = "sample",
    scale: str = "group",
    eps: float = 1e-6,
) -> Tensor:
    """GRPO (DeepSeekMath, Shao et al. 2024, arXiv:2402.03300).

    ``A_i = (R_i - mean_{group} R) / (sigma + eps)`` where sigma is the group's reward std
    (``scale="group"``, default), the std of all rewards in the batch (``scale="batch"``),
    or 1 with no eps (``scale="none"``, which equals ``dr_grpo``). ``std="sample"`` (default)
    uses Bessel's n-1 (a size-1 group has std 0, so advantage 0), ``"population"`` uses n.
    """
    if std not in ("sample", "population"):
        raise ValueError(f"std must be 'sample' or 'population', got {std!r}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    r, index, counts, means = _group_stats(rewards, group_ids)
    centered = r - means[index]
    if scale == "group":
        sq = _group_sum(centered.square(), index, counts.numel())
        advantages = centered / (_std(sq, counts, std)[index] + eps)
    elif scale == "batch":
        batch_sq = (r - r.mean()).square().sum() if r.numel() else r.new_zeros(())
        batch_std = _std(batch_sq, r.new_tensor(float(r.numel())), std)
        advantages = centered / (batch_std + eps)
    elif scale == "none":
        advantages = centered
    else:
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    flat = _zero_variance(r, index, counts.numel())[index]
    return torch.where(flat, 0.0, advantages).to(_float_dtype(rewards))


@ADVANTAGES.register("dr_grpo")
def dr_grpo(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783).

    ``A_i = R_i - mean_{group} R`` (no division by the std).
    """
    r, index, counts, means = _group_stats(rewards, group_ids)
    flat = _zero_variance(r, index, counts.numel())[index]
    return torch.where(flat, 0.0, r - means[index]).to(_float_dtype(rewards))


@ADVANTAGES.register("rloo")
def rloo(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """RLOO (Ahmadian et al. 2024, "Back to Basics", arXiv:2402.14740).

    ``A_i = R_i - (1/(G-1)) sum_{j != i} R_j`` (leave-one-out baseline); a group of size 1
    has no baseline and gets advantage 0.
    """
    r, index, counts, means = _group_stats(rewards, group_ids)
    n = counts[index]
    others_mean = (means[index] * n - r) / (n - 1.0).clamp_min(1.0)
    flat = _zero_variance(r, index, counts.numel())[index] | (n < 2)
    return torch.where(flat, 0.0, r - others_mean).to(_float_dtype(rewards))


def advantages_of_valid(estimator: Callable[..., Tensor], rewards: Tensor, group_ids: Tensor, valid: Tensor,
                        **options: object) -> Tensor:
    """Run a sequence-level `estimator` on the valid completions only; the others get 0.

    A completion whose reward could not be computed must not move its group's baseline (its
    reward is unknown, not 0), so it is left out of the statistics and receives no gradient.
    """
    _check(rewards, group_ids)
    if valid.shape != rewards.shape or valid.dtype != torch.bool:
        raise ValueError(f"valid must be a bool tensor of shape {tuple(rewards.shape)}")
    out = torch.zeros_like(rewards, dtype=_float_dtype(rewards))
    if valid.any():
        out[valid] = estimator(rewards[valid], group_ids[valid], **options)
    return out


def whiten_sequences(
    advantages: Tensor,
    valid: Tensor | None = None,
    *,
    eps: float = 1e-8,
    unbiased: bool = False,
) -> Tensor:
    """``(A_i - mean A) / (std A + eps)`` over the batch's sequences, one value per sequence [N].

    Per-sequence whitening, as TRL's RLOO ``normalize_advantages`` (which uses torch's sample
    std, i.e. ``unbiased=True``, and ``eps = 1e-4``): every sequence counts once whatever its
    length, and eps is added to the std, not to the variance (unlike `masked_whiten`, which
    whitens over tokens as ``(x - mu) / sqrt(var + eps)``). ``valid`` (bool [N], default all)
    selects the sequences that enter the statistics; the others get exactly 0.
    ``unbiased=True`` uses Bessel's n-1 (a single sequence has std 0). Float64 inside, result in
    ``advantages.dtype`` (the default float dtype for integer or bool input); an empty selection
    gives all zeros. Not differentiable (detached).
    """
    if advantages.dim() != 1:
        raise ValueError(f"advantages must be 1-D [N], got shape {tuple(advantages.shape)}")
    if valid is None:
        valid = torch.ones_like(advantages, dtype=torch.bool)
    if valid.shape != advantages.shape or valid.dtype != torch.bool:
        raise ValueError(f"valid must be a bool tensor of shape {tuple(advantages.shape)}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    a = torch.where(valid, advantages.detach().to(torch.float64), 0.0)
    count = valid.sum().to(torch.float64)
    mean = a.sum() / count.clamp_min(1.0)
    centered = torch.where(valid, a - mean, 0.0)
    std = _std(centered.square().sum(), count, "sample" if unbiased else "population")
    denom = std + eps
    out = torch.where(valid & (denom > 0), centered / torch.where(denom > 0, denom, 1.0), 0.0)
    return out.to(_float_dtype(advantages))
