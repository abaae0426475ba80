"""Batch-level filters and shaping from DAPO (Yu et al. 2025, arXiv:2503.14476).

Dynamic sampling (keep only groups with signal) and overlong handling (soft length penalty,
or masking truncated completions out of the loss).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lmpo.algos.advantages import _check, _group_index, _zero_variance


def groups_with_signal(rewards: Tensor, group_ids: Tensor, valid: Tensor | None = None) -> Tensor:
    """Bool [N]: True for members of groups whose rewards are not all equal (DAPO dynamic sampling).

    A group with all-equal rewards has advantage 0 under every group estimator; a group of
    size 1 counts as all-equal. With `valid` (bool [N]), only valid members' rewards count, and
    every member of a group with signal is True, valid or not.
    """
    _check(rewards, group_ids)
    if valid is not None:
        if valid.shape != rewards.shape or valid.dtype != torch.bool:
            raise ValueError(f"valid must be a bool tensor of shape {tuple(rewards.shape)}")
        if not valid.any():
            return torch.zeros_like(valid)
        signal_groups = group_ids[valid][groups_with_signal(rewards[valid], group_ids[valid])]
        return torch.isin(group_ids, signal_groups)
    index, num_groups = _group_index(group_ids)
    return ~_zero_variance(rewards.detach().to(torch.float64), index, num_groups)[index]


def overlong_penalty(lengths: Tensor, max_len: int, cache_len: int) -> Tensor:
    """DAPO soft overlong punishment, added to the reward [N].

    With ``L_exp = max_len - cache_len``: 0 if ``L <= L_exp``; ``(L_exp - L) / cache_len`` if
    ``L_exp < L <= max_len`` (linear from 0 to -1); -1 if ``L > max_len``. Float dtype of
    ``lengths`` if floating, else the default dtype.
    """
    if cache_len <= 0 or cache_len > max_len:
        raise ValueError(
            f"need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}"
        )
    dtype = lengths.dtype if lengths.dtype.is_floating_point else torch.get_default_dtype()
    expected = max_len - cache_len
    L = lengths.detach().to(torch.float64)
    penalty = ((expected - L) / cache_len).clamp(-1.0, 0.0)
    return torch.where(L > max_len, -1.0, penalty).to(dtype)


def truncation_mask(mask: Tensor, truncated: Tensor) -> Tensor:
    """DAPO overlong filtering: ``mask`` [B,T] with the whole row zeroed where ``truncated`` [B].

    Same dtype as ``mask``. Zeroed rows count as no sequence in `aggregation.py`.
    """
    if mask.dim() != 2 or truncated.shape != mask.shape[:1]:
        raise ValueError(
            f"need mask [B, T] and truncated [B], "
            f"got {tuple(mask.shape)} and {tuple(truncated.shape)}"
        )
    return torch.where(truncated.bool().unsqueeze(-1), torch.zeros_like(mask), mask)
