"""Attention by segments on the CPU at bf16 as one autograd function: two matmuls around a softmax.

The same computation as attention by segments elsewhere (`segments`): each bucket's queries
attend to the keys its segments may see, here as two matmuls in the compute dtype (the CPU
autocast dtype, or a bf16 model's) around a softmax in at least fp32 (the precision GPU flash
kernels keep), the scale and the mask folded into the first. PyTorch's CPU flash kernel, called
once per bucket, is the alternative: its bf16 backward is ~3x slower than its fp32 one, and for a
bucket of short segments (a DPO pair's answers, a sort task's completions) its fixed cost per
call outweighs the arithmetic. What differs from a formulation in PyTorch operations is the
bookkeeping around the matmuls. Written as operations under autograd, a layer gathered queries,
keys and values bucket by bucket, cast, transposed and copied each gather, and its backward
mirrored every one of those steps: on a DPO step of the bench's 3.7M model at bf16, 45-58 ms of a
~250 ms step for 4 layers, of which the matmuls were ~15 ms (`bench/segment_attention.py`). Here
one gather per tensor produces every bucket's rows at once, already in the layout the matmuls
want ((token, head) rows picked by a precomputed index); the backward is written out (the
textbook gradients of softmax attention): a query's gradient is gathered back by the same index
that placed its output, and the keys' and values' (a prompt's are seen by several segments) are
added back in one `index_add_` each, in at least fp32.

The softmax weights are kept for the backward, one number per query, head and key seen (a flash
kernel keeps one per query and head), so `segments` takes this path only while a query sees few
keys on average (`MATMUL_ATTENTION_KEYS`): there the matmuls are also the faster path, and the
weights cost less than the layer's other activations. Longer sequences (a 2,048-token
completion's queries see ~1,000 keys) take the kernel, at fp32.

Forward outputs equal the autograd formulation's bit for bit; query and key gradients agree to
fp32 rounding (the same products, summed in another order). Value gradients are summed in fp32
before their one rounding to bf16 (autograd summed them in bf16).
"""

from __future__ import annotations

import torch


class BucketRows:
    """Where a plan's buckets sit in the flat rows of one layer, for given head counts: query rows
    in the order [segment, kv head, query head of its group, position] (so a bucket's queries are
    one contiguous [S * kv, group * L, D] block), key and value rows [segment, kv head, key]."""

    def __init__(self, plan, heads: int, kv_heads: int, low: torch.dtype, device: torch.device):
        group = heads // kv_heads
        q_index, kv_index, self.spans = [], [], []
        q_at = kv_at = 0
        for b in plan.buckets:
            segments, length = b.queries.shape
            keys = b.keys.size(1)
            head = torch.arange(heads, device=device).view(1, heads, 1)
            q_index.append((b.queries.view(segments, 1, length) * heads + head).reshape(-1))
            kv_head = torch.arange(kv_heads, device=device).view(1, kv_heads, 1)
            kv_index.append((b.keys.view(segments, 1, keys) * kv_heads + kv_head).reshape(-1))
            bias = b.bias(low, heads).reshape(segments * kv_heads, group * length, keys)
            self.spans.append((slice(q_at, q_at + segments * heads * length),
                               slice(kv_at, kv_at + segments * kv_heads * keys), bias))
            q_at += segments * heads * length
            kv_at += segments * kv_heads * keys
        self.q_index, self.kv_index = torch.cat(q_index), torch.cat(kv_index)
        self.q_rows, self.kv_rows = q_at, kv_at
        real = plan.tokens * heads  # rows past it are the trash position's (padding of the buckets)
        slot = torch.full((real + heads,), q_at, dtype=torch.long, device=device)  # idle positions: the zero row past the end
        slot[self.q_index] = torch.arange(q_at, device=device)
        self.out_order = slot[:real]  # for each (token, head) row of the output, its bucket row
        self.grad_rows = self.q_index.clamp(max=real)  # for each bucket row, its output row (padding: a zero row)
        self.kv_heads, self.low = kv_heads, low
        self.softmax_dtype = torch.promote_types(low, torch.float32)  # fp32 for bf16 (float64 in tests)


def _flat_rows(t: torch.Tensor, low: torch.dtype) -> torch.Tensor:
    """[R, H, N, D] -> [(R * N + 1) * H, D] in `low`: rows (token, head), then the trash position's, zero."""
    rows, heads, n, dim = t.shape
    flat = torch.empty(rows * n + 1, heads, dim, dtype=low, device=t.device)
    flat[:-1].view(rows, n, heads, dim).copy_(t.transpose(1, 2))
    flat[-1].zero_()
    return flat.view(-1, dim)


def _add_rows(grad: torch.Tensor, index: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """The gradient [R, H, N, D] of a tensor whose flat rows were gathered by `index`: repeats
    summed in index order, in fp32."""
    rows, heads, n, dim = shape
    total = torch.zeros((rows * n + 1) * heads, dim, dtype=torch.promote_types(grad.dtype, torch.float32),
                        device=grad.device)
    total.index_add_(0, index, grad.to(total.dtype))
    return total[: rows * n * heads].view(rows, n, heads, dim).transpose(1, 2).to(dtype)


class _SegmentAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, where: BucketRows, scale: float, dropout: float):
        rows, heads, n, dim = query.shape
        low = where.low
        q = _flat_rows(query, low).index_select(0, where.q_index)
        k = _flat_rows(key, low).index_select(0, where.kv_index)
        v = _flat_rows(value, low).index_select(0, where.kv_index)
        out = torch.empty(where.q_rows + 1, dim, dtype=low, device=query.device)
        out[-1].zero_()
        weights = []
        for q_rows, kv_rows, bias in where.spans:
            batch = bias.size(0)
            scores = torch.baddbmm(bias, q[q_rows].view(batch, -1, dim), k[kv_rows].view(batch, -1, dim).transpose(1, 2),
                                   alpha=scale)
            probs = torch.softmax(scores, -1, dtype=where.softmax_dtype)
            keep = None
            if dropout:
                keep = torch.rand_like(probs) >= dropout
                probs_low = (probs * keep).mul_(1 / (1 - dropout)).to(low)
            else:
                probs_low = probs.to(low)
            torch.bmm(probs_low, v[kv_rows].view(batch, -1, dim), out=out[q_rows].view(batch, -1, dim))
            weights.append((probs, probs_low, keep))
        ctx.save_for_backward(q, k, v)
        ctx.weights, ctx.where, ctx.scale, ctx.dropout = weights, where, scale, dropout
        ctx.shapes = (query.shape, key.shape, query.dtype, key.dtype, value.dtype)
        return out.index_select(0, where.out_order).view(rows, n, heads, dim)

    @staticmethod
    def backward(ctx, grad):
        q, k, v = ctx.saved_tensors
        where, scale, dropout = ctx.where, ctx.scale, ctx.dropout
        q_shape, kv_shape, q_dtype, k_dtype, v_dtype = ctx.shapes
        dim = q.size(1)
        grad = torch.cat([grad.reshape(-1, dim).to(q.dtype), grad.new_zeros(1, dim, dtype=q.dtype)])
        grad = grad.index_select(0, where.grad_rows)  # in the buckets' row order; padding rows zero
        dq = q.new_empty(q.size(0) + 1, dim)  # a zero row last, for idle positions
        dq[-1].zero_()
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        for (q_rows, kv_rows, bias), (probs, probs_low, keep) in zip(where.spans, ctx.weights):
            batch = bias.size(0)
            g = grad[q_rows].view(batch, -1, dim)
            qb, kb, vb = (t[r].view(batch, -1, dim) for t, r in ((q, q_rows), (k, kv_rows), (v, kv_rows)))
            torch.bmm(probs_low.transpose(1, 2), g, out=dv[kv_rows].view(batch, -1, dim))
            dprobs = torch.bmm(g, vb.transpose(1, 2)).to(probs.dtype)
            if keep is not None:
                dprobs.mul_(keep).mul_(1 / (1 - dropout))
            dscores = torch._softmax_backward_data(dprobs, probs, -1, probs.dtype).to(q.dtype)
            torch.bmm(dscores, kb, out=dq[q_rows].view(batch, -1, dim)).mul_(scale)
            torch.bmm(dscores.transpose(1, 2), qb, out=dk[kv_rows].view(batch, -1, dim)).mul_(scale)
        # each position is one bucket row's query (or idle): its gradient is gathered, not summed
        rows, heads, n, _ = q_shape
        dq = dq.index_select(0, where.out_order).view(rows, n, heads, dim).transpose(1, 2).to(q_dtype)
        return (dq, _add_rows(dk, where.kv_index, kv_shape, k_dtype), _add_rows(dv, where.kv_index, kv_shape, v_dtype),
                None, None, None)


# keys a query sees on average (bucket padding included), past which the kernel runs (at fp32), by
# the dtype the matmuls would run in. At bf16 on a 2-core AMD EPYC (`bench/attention_paths.py`),
# plans of segments of one length ran as matmuls in 0.1-0.9x the fp32 kernel's time up to ~190
# keys and 1.3-1.7x from ~220; but a long-tailed plan (the bench's (b): 220-250 keys a query on
# average, most segments short) ran whole GRPO steps ~9% faster as matmuls (steps alternated in
# one process). So the limit is where the kept weights, not the speed, decide: at 512 keys they
# are about a layer's other activations. At fp32 the matmuls are faster up to ~150 keys too
# (0.2-0.9x), but fp32 keeps the kernel: the matmuls sum in another order, and every fp32 run's
# numbers (the README's trained figures among them) would move by float rounding.
MATMUL_ATTENTION_KEYS = {torch.bfloat16: 512}


def compute_dtype(query: torch.Tensor) -> torch.dtype:
    """The dtype the matmuls run in: the CPU autocast dtype under autocast, else the query's."""
    return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else query.dtype


def takes_matmuls(query: torch.Tensor, plan) -> bool:
    """Whether attention by `plan` runs as matmuls (see `MATMUL_ATTENTION_KEYS`): on the CPU only."""
    limit = MATMUL_ATTENTION_KEYS.get(compute_dtype(query))
    return query.device.type == "cpu" and limit is not None and keys_per_query(plan) <= limit


def keys_per_query(plan) -> float:
    """Keys a query sees on average under `plan`, bucket padding included: the softmax weights the
    matmul path keeps for the backward, per position and head."""
    return sum(b.allowed.numel() for b in plan.buckets) / max(plan.tokens, 1)


def matmul_segment_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, plan,
                             scaling: float | None, dropout: float = 0.0) -> torch.Tensor:
    """Attention [R, N, H, D] by `plan` (a `segments.SegmentPlan`) for query [R, H, N, D] and
    key/value [R, H_kv, N, D], in the CPU autocast dtype under autocast, else in the query's
    dtype; grouped-query heads shared, not copied."""
    low = compute_dtype(query)
    heads, kv_heads = query.size(1), key.size(1)
    if (heads, kv_heads, low) not in plan.rows:  # made once per plan, for all its layers
        plan.rows[(heads, kv_heads, low)] = BucketRows(plan, heads, kv_heads, low, query.device)
    scale = query.size(-1) ** -0.5 if scaling is None else scaling
    return _SegmentAttention.apply(query, key, value, plan.rows[(heads, kv_heads, low)], scale, dropout)
