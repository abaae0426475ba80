"""Attention by segments, for packed forwards. A packed batch is one row of units (a prompt, then
the completions that share it); a prompt attends causally to itself, a completion to its prompt
and causally to its own tokens. Instead of one attention over the whole row under a
block-diagonal mask (whose work grows with the row's length squared, masked pairs included),
each segment's queries and the keys it may see are gathered into a dense batch, segments of
similar length bucketed together, and each bucket runs as one scaled-dot-product attention: the
work is that of the allowed pairs, plus the padding inside a bucket.

It runs inside any Hugging Face model that dispatches attention through transformers'
`AttentionInterface` (all its causal LMs do): lmpo registers, under "sdpa", a function that is
transformers' own SDPA attention unless the forward passes `lmpo_segments` (a `SegmentPlan`),
so no model code is copied. A forward given a plan checks that every layer used it."""

from __future__ import annotations

import array
from dataclasses import dataclass, field
from itertools import chain

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from lmpo.models.matmul_segments import matmul_segment_attention, takes_matmuls

SPREAD = 0.8  # a segment joins its bucket while at least this fraction of the bucket's longest


@dataclass
class Bucket:
    """Segments run as one attention: `queries` [S, L] flat token positions (padding points at the
    trash position, one past the last token), `keys` [S, C + L] the context each may see (padded
    to C) then its own positions, `allowed` [S, 1, L, C + L] which of those keys each query sees."""

    queries: torch.Tensor
    keys: torch.Tensor
    allowed: torch.Tensor
    biases: dict = field(default_factory=dict, repr=False, compare=False)

    def bias(self, dtype: torch.dtype, heads: int) -> torch.Tensor:
        """`allowed` as an additive bias [S * heads, L, C] (0 or the dtype's lowest), made once
        per dtype and head count for all the layers that use the bucket."""
        if (dtype, heads) not in self.biases:
            segments, _, length, context = self.allowed.shape
            bias = torch.zeros(self.allowed.shape, dtype=dtype, device=self.allowed.device)
            bias.masked_fill_(~self.allowed, torch.finfo(dtype).min)
            self.biases[(dtype, heads)] = bias.expand(-1, heads, -1, -1).reshape(segments * heads, length, context)
        return self.biases[(dtype, heads)]


@dataclass
class SegmentPlan:
    """The buckets of a packed row of `tokens` positions, and `order`: for each position, its
    slot among the buckets' concatenated queries (`idle` positions, padding, point past the last:
    a zero row). `calls` counts the layers that used it; `rows` keeps the gather indices of
    `bf16_segments`, made once for all the layers."""

    buckets: list[Bucket]
    order: torch.Tensor
    tokens: int
    idle: int = 0
    calls: int = field(default=0, compare=False)
    rows: dict = field(default_factory=dict, repr=False, compare=False)  # bf16_segments' row indices


def bucket_segments(own_lengths: list[int], spread: float = SPREAD) -> list[list[int]]:
    """Indices of segments per bucket, longest first; a bucket takes segments down to `spread`
    of its longest, so its padding stays under 1 - spread of its work."""
    buckets: list[list[int]] = []
    for i in sorted(range(len(own_lengths)), key=lambda i: -own_lengths[i]):
        if not buckets or own_lengths[i] < spread * own_lengths[buckets[-1][0]]:
            buckets.append([])
        buckets[-1].append(i)
    return buckets


def attention_pairs(segments: list[tuple[int, int]]) -> int:
    """Query-key pairs the buckets compute for segments of (context, own) lengths."""
    total = 0
    for members in bucket_segments([own for _, own in segments]):
        own = segments[members[0]][1]
        context = max(segments[i][0] for i in members)
        total += len(members) * own * (context + own)
    return total


def cpu_autocast(device: torch.device) -> bool:
    """True for a CPU tensor inside CPU autocast (lmpo's CPU bf16). There PyTorch's flash attention
    runs its backward ~3x slower in bf16 than in fp32 (AVX512-BF16, measured), and the matmuls go
    through oneDNN, which keeps a primitive of about 2 MB per distinct shape (150 new shapes: +300
    MB of RSS), so packed forwards pad their shapes to a coarse grid and a run sees few of them."""
    return device.type == "cpu" and torch.is_autocast_enabled("cpu")


def round_up(n: int, grain: int) -> int:
    return -(-n // grain) * grain


def long_tensor(values, device: torch.device | None = None) -> torch.Tensor:
    """A 1-D long tensor from an iterable of ints, through a machine array: about 3x faster than
    `torch.tensor` on a list, for the index lists a packed forward builds every step."""
    values = array.array("q", values)
    return torch.frombuffer(values, dtype=torch.long).to(device) if values else torch.zeros(0, dtype=torch.long, device=device)


def token_grain(tokens: int) -> int:
    """A grid for a row of `tokens`: 16 steps per doubling (at most ~6% padding)."""
    return max(16, 1 << max(tokens.bit_length() - 5, 0))


def plan_segments(segments: list[tuple[list[int], list[int]]], tokens: int,
                  device: torch.device | None = None, grain: int = 1, idle: list[int] | tuple = ()) -> SegmentPlan:
    """A plan for segments given as (context positions, own positions) in a row of `tokens`
    flat positions, each position some segment's own exactly once, or `idle` (padding: its
    attention output is zero, and nothing attends to it). With `grain` > 1 each bucket's lengths
    and segment count are padded to multiples of it (see `cpu_autocast`), and buckets that pad
    to the same lengths run as one."""
    trash = tokens
    padded: dict[tuple[int, int], list] = {}  # (own, context) after padding -> its segments
    for members in bucket_segments([len(own) for _, own in segments]):
        chosen = [segments[i] for i in members]
        shape = (round_up(len(chosen[0][1]), grain), round_up(max(len(c) for c, _ in chosen), grain))
        padded.setdefault(shape, []).extend(chosen)
    buckets, slots = [], []
    for (own, context), chosen in padded.items():
        chosen += [([], [])] * (round_up(len(chosen), grain) - len(chosen))  # whole padding segments
        queries = [o + [trash] * (own - len(o)) for _, o in chosen]
        keys = chain.from_iterable(c + [trash] * (context - len(c)) + q for (c, _), q in zip(chosen, queries))
        seen = torch.arange(context) < long_tensor(len(c) for c, _ in chosen)[:, None]
        causal = torch.ones(own, own, dtype=torch.bool).tril()
        allowed = torch.cat([seen[:, None, :].expand(-1, own, -1), causal.expand(len(chosen), -1, -1)], dim=2)
        buckets.append(Bucket(long_tensor(chain.from_iterable(queries), device).view(len(chosen), own),
                              long_tensor(keys, device).view(len(chosen), context + own), allowed[:, None].to(device)))
        slots += [q for row in queries for q in row]
    order = [-1] * tokens
    for slot, position in enumerate(slots):
        if position != trash:
            order[position] = slot
    covered = len(slots) - slots.count(trash)
    for position in idle:
        if order[position] != -1:
            covered = -1  # owned twice: refused below
        order[position] = len(slots)  # one past the last slot: a zero row
    if -1 in order or covered + len(idle) != tokens:
        raise ValueError(f"a segment plan must cover each of the row's {tokens} positions exactly once")
    return SegmentPlan(buckets, long_tensor(order, device), tokens, idle=len(idle))


def segment_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, plan: SegmentPlan,
                      scaling: float | None, dropout: float = 0.0) -> torch.Tensor:
    """Attention [R, N, H, D] for query [R, H, N, D] and key/value [R, H_kv, N, D] (R * N ==
    plan.tokens) following the plan; grouped-query heads are shared, not copied. On the CPU at
    bf16, two matmuls around a softmax while the weights they keep are few (`matmul_segments`);
    else PyTorch's attention kernel per bucket, in fp32 under CPU autocast (its bf16 backward is
    slow)."""
    if takes_matmuls(query, plan):
        return matmul_segment_attention(query, key, value, plan, scaling, dropout)
    if cpu_autocast(query.device):
        with torch.autocast("cpu", enabled=False):
            out = kernel_segment_attention(query.float(), key.float(), value.float(), plan, scaling, dropout)
        return out.to(torch.get_autocast_dtype("cpu"))
    return kernel_segment_attention(query, key, value, plan, scaling, dropout)


def kernel_segment_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, plan: SegmentPlan,
                             scaling: float | None, dropout: float = 0.0) -> torch.Tensor:
    """`segment_attention` as one call of PyTorch's attention kernel per bucket."""
    rows, heads, n, dim = query.shape

    def flat(t: torch.Tensor) -> torch.Tensor:  # [R * N + 1, heads, D]: the last row is the trash position
        t = t.transpose(1, 2).reshape(rows * n, t.size(1), dim)
        return torch.cat([t, t.new_zeros(1, t.size(1), dim)])

    q, k, v = flat(query), flat(key), flat(value)
    outs = []
    for b in plan.buckets:  # index_select, not indexing: its backward adds without sorting the indices
        gather = lambda t, index: t.index_select(0, index.reshape(-1)).view(*index.shape, t.size(1), dim).transpose(1, 2)  # noqa: E731
        keys, values = gather(k, b.keys), gather(v, b.keys)
        out = F.scaled_dot_product_attention(gather(q, b.queries), keys, values, attn_mask=b.allowed, dropout_p=dropout,
                                             scale=scaling, enable_gqa=keys.size(1) != heads)
        outs.append(out.transpose(1, 2).reshape(-1, heads, dim))
    if plan.idle:
        outs.append(q.new_zeros(1, heads, dim))
    return torch.cat(outs).index_select(0, plan.order).view(rows, n, heads, dim)


_library_sdpa = AttentionInterface._global_mapping["sdpa"]


def sdpa_or_segments(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     lmpo_segments: SegmentPlan | None = None, **kwargs):
    """transformers' SDPA attention, or, given a plan, `segment_attention` (the mask is then unused)."""
    if lmpo_segments is None:
        if cpu_autocast(query.device):  # the CPU flash kernel in fp32: its low-precision backward is the slow one
            with torch.autocast("cpu", enabled=False):
                mask = attention_mask.float() if attention_mask is not None and attention_mask.is_floating_point() \
                    else attention_mask
                return _library_sdpa(module, query.float(), key.float(), value.float(), mask, dropout=dropout,
                                     scaling=scaling, **kwargs)
        return _library_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    lmpo_segments.calls += 1
    return segment_attention(query, key, value, lmpo_segments, scaling, dropout), None


if getattr(_library_sdpa, "__name__", "") != sdpa_or_segments.__name__:  # a reload must not wrap itself
    AttentionInterface.register("sdpa", sdpa_or_segments)
