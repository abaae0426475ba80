"""Padding-free forwards: a batch's sequences (real prompt tokens, then the completion up to its
last scored token) laid end to end in a few rows, positions restarting at each sequence, and
attention kept within each sequence by a block-diagonal causal mask. The model then computes
nothing for padding, and the output head runs only on the tokens that are scored.

Rows are filled first-fit, longest sequence first, up to the longest sequence's length (or a
larger `row_tokens`), so a row's attention never spans more than one row's worth of tokens.
The numbers equal the padded forward's to float tolerance (the same sums in another order);
`pays_to_pack` says when the saving is worth the explicit mask (with no padding at all the
padded forward keeps its faster causal attention)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

PACK_MIN_SAVING = 0.15
"""Pack only when padding would be at least this fraction of the padded batch's tokens."""


@dataclass
class PackedRows:
    """A batch packed into rows [R, N]; `segments` numbers each row's sequences (padding gets its
    own negative id per position). For each scored token, `predictor` is the flat index into
    [R * N] of the state that predicts it, `targets` its id and `scatter` its flat index into the
    batch's [B * T] completion grid."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segments: torch.Tensor
    predictor: torch.Tensor
    targets: torch.Tensor
    scatter: torch.Tensor


def real_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> list[list[int]]:
    return [row[mask.bool()].tolist() for row, mask in zip(prompt_ids, prompt_mask)]


def pays_to_pack(prompt_mask: torch.Tensor, lengths: torch.Tensor) -> bool:
    """True when the trimmed padded batch would hold at least PACK_MIN_SAVING padding."""
    prompt_lengths = prompt_mask.sum(dim=1)
    real = int((prompt_lengths + lengths).sum())
    padded = prompt_mask.size(0) * (int(prompt_lengths.max()) + int(lengths.max()))
    return padded > 0 and real <= (1 - PACK_MIN_SAVING) * padded


def pack_completions(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                     lengths: torch.Tensor, pad_id: int = 0, row_tokens: int = 0) -> PackedRows:
    """Pack each row's real prompt and its first `lengths[b]` completion tokens (rows with length
    0 are left out: nothing of theirs is scored)."""
    prompts = real_prompts(prompt_ids, prompt_mask)
    completions = completion_ids.tolist()
    width = completion_ids.size(1)
    sizes = [(len(prompts[b]) + int(n), b) for b, n in enumerate(lengths.tolist()) if n > 0]
    capacity = max([row_tokens] + [s for s, _ in sizes]) if sizes else 1
    rows: list[list[int]] = []  # the sequences (batch rows) of each packed row
    room: list[int] = []
    for size, b in sorted(sizes, key=lambda x: -x[0]):
        slot = next((r for r, free in enumerate(room) if free >= size), None)
        if slot is None:
            rows.append([])
            room.append(capacity)
            slot = len(rows) - 1
        rows[slot].append(b)
        room[slot] -= size
    n_rows = max(len(rows), 1)
    ids = [[pad_id] * capacity for _ in range(n_rows)]
    positions = [list(range(capacity)) for _ in range(n_rows)]
    segments = [[-1 - i for i in range(capacity)] for _ in range(n_rows)]
    predictor, targets, scatter = [], [], []
    for r, members in enumerate(rows):
        at = 0
        for segment, b in enumerate(members):
            n = int(lengths[b])
            tokens = prompts[b] + completions[b][:n]
            ids[r][at:at + len(tokens)] = tokens
            positions[r][at:at + len(tokens)] = range(len(tokens))
            segments[r][at:at + len(tokens)] = [segment] * len(tokens)
            first = r * capacity + at + len(prompts[b]) - 1  # the last prompt token predicts the first one
            predictor += range(first, first + n)
            targets += completions[b][:n]
            scatter += range(b * width, b * width + n)
            at += len(tokens)
    as_long = lambda x: torch.tensor(x, dtype=torch.long, device=completion_ids.device)  # noqa: E731
    return PackedRows(as_long(ids), as_long(positions), as_long(segments), as_long(predictor), as_long(targets),
                      as_long(scatter))


def block_causal_mask(segments: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Attention mask [R, 1, N, N], True (or 0 with a float `dtype`: additive, for eager
    attention) where a token may attend: same sequence, not later; False (the dtype's minimum)
    elsewhere. Each padding position attends to itself only, so no softmax row is empty (an
    empty one would put NaN into the backward)."""
    n = segments.size(1)
    causal = torch.ones(n, n, dtype=torch.bool, device=segments.device).tril()
    allowed = ((segments[:, :, None] == segments[:, None, :]) & causal)[:, None]
    if dtype is None:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=segments.device).masked_fill_(~allowed, torch.finfo(dtype).min)


def packed_states(trunk: torch.nn.Module, packed: PackedRows) -> torch.Tensor:
    """The trunk's last hidden states [K, H] at the positions that predict the scored tokens."""
    eager = trunk.config._attn_implementation == "eager"
    mask = block_causal_mask(packed.segments, trunk.dtype if eager else None)
    states = trunk(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=mask,
                   use_cache=False).last_hidden_state
    return states.reshape(-1, states.size(-1))[packed.predictor]
