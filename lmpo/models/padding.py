"""Padding token lists into batches."""

from __future__ import annotations

from typing import Sequence

import torch


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into (input_ids, attention_mask)."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt must have at least one token")
    width = max(len(p) for p in prompts)
    # padded as lists, then one tensor each: a tensor per row costs more than the rows' contents
    ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
    return ids, mask


def right_pad(seqs: Sequence[Sequence[float]], pad_value: float,
              dtype: torch.dtype = torch.long) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad lists into (values, mask) where mask is 1 on real entries."""
    if not seqs:
        raise ValueError("nothing to pad")
    width = max(len(s) for s in seqs)
    values = torch.full((len(seqs), width), pad_value, dtype=dtype)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        values[row, : len(seq)] = torch.tensor(seq, dtype=dtype)
        mask[row, : len(seq)] = 1
    return values, mask
