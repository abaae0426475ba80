"""Attention by segments on the CPU as matmuls around a softmax (`lmpo.models.matmul_segments`):
its written-out backward is the gradient of its forward; in fp32 its numbers are those of
PyTorch's attention kernel per bucket to float rounding; under bf16 autocast they are the
kernel's at fp32 to bf16 tolerance and those of the same computation under autograd to float
rounding; past its budget of keys per query, and at fp32 always, the kernel runs instead."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import lmpo.models.segments as segments_module
import lmpo.models.matmul_segments as matmul_segments
from lmpo.models.matmul_segments import BucketRows, _SegmentAttention, keys_per_query, matmul_segment_attention
from lmpo.models.segments import kernel_segment_attention, plan_segments, segment_attention


def shared_prompt_plan(grain: int = 1, idle: bool = False):
    """Two units: a prompt of 5 with completions of 7 and 3; a prompt of 4 with one of 9; then 2
    positions of padding, attending to themselves or (`idle`, as a coarse grid leaves them)
    attended by nothing: 30 positions."""
    spans, at = [], 0
    for prompt, completions in ((5, (7, 3)), (4, (9,))):
        own = list(range(at, at + prompt))
        spans.append(([], own))
        at += prompt
        for n in completions:
            spans.append((own, list(range(at, at + n))))
            at += n
    if idle:
        return plan_segments(spans, at + 2, grain=grain, idle=[at, at + 1]), at + 2
    spans.append(([], [at, at + 1]))
    return plan_segments(spans, at + 2, grain=grain), at + 2


def qkv(tokens: int, dtype=torch.float32, heads: int = 4, kv_heads: int = 2, dim: int = 8):
    torch.manual_seed(0)
    return [torch.randn(1, h, tokens, dim, dtype=dtype, requires_grad=True) for h in (heads, kv_heads, kv_heads)]


def fixed_dropout_mask(monkeypatch):
    """`rand_like` made a function of the shape, so that every forward of a gradcheck drops the same weights."""
    monkeypatch.setattr(torch, "rand_like",
                        lambda t: torch.rand(t.shape, generator=torch.Generator().manual_seed(t.numel()), dtype=t.dtype))


@pytest.mark.parametrize("dropout,idle", [(0.0, False), (0.3, False), (0.0, True)])
def test_the_written_out_backward_is_the_gradient(dropout, idle, monkeypatch):
    fixed_dropout_mask(monkeypatch)
    plan, tokens = shared_prompt_plan(grain=4, idle=idle)  # padded buckets and whole padding segments too
    q, k, v = qkv(tokens, torch.float64)
    where = BucketRows(plan, 4, 2, torch.float64, q.device)
    torch.autograd.gradcheck(lambda *t: _SegmentAttention.apply(*t, where, 0.3, dropout), (q, k, v))


def autograd_formulation(query, key, value, plan):
    """The same computation as plain operations under autograd: per bucket, gather, cast to bf16,
    scores with the mask's bias, fp32 softmax, bf16 weighted sum."""
    rows, heads, n, dim = query.shape
    kv = key.size(1)
    flat = lambda t: torch.cat([t.transpose(1, 2).reshape(n, t.size(1), dim), t.new_zeros(1, t.size(1), dim)])  # noqa: E731
    q, k, v = flat(query), flat(key), flat(value)
    outs = []
    for b in plan.buckets:
        segments, length = b.queries.shape
        gather = lambda t, i: t.index_select(0, i.reshape(-1)).view(*i.shape, t.size(1), dim).transpose(1, 2)  # noqa: E731
        qb = gather(q, b.queries).to(torch.bfloat16).reshape(segments * kv, -1, dim)
        kb, vb = gather(k, b.keys).to(torch.bfloat16), gather(v, b.keys).to(torch.bfloat16)
        scores = torch.baddbmm(b.bias(torch.bfloat16, heads).view(segments * kv, -1, kb.size(2)), qb,
                               kb.reshape(segments * kv, -1, dim).transpose(1, 2), alpha=dim ** -0.5)
        weights = scores.float().softmax(-1).to(torch.bfloat16)
        out = (weights @ vb.reshape(segments * kv, -1, dim)).view(segments, heads, length, dim)
        outs.append(out.transpose(1, 2).reshape(-1, heads, dim))
    outs += [torch.zeros(plan.idle and 1, heads, dim, dtype=torch.bfloat16)]  # what idle positions read
    return torch.cat(outs).index_select(0, plan.order).view(rows, n, heads, dim)


@pytest.mark.parametrize("idle", [False, True])
def test_bf16_attention_by_segments_matches_fp32_and_its_autograd_formulation(idle):
    plan, tokens = shared_prompt_plan(grain=8, idle=idle)
    weights = torch.randn(1, tokens, 4, 8)
    exact_q, exact_k, exact_v = qkv(tokens)
    exact = kernel_segment_attention(exact_q, exact_k, exact_v, plan, None)  # fp32: PyTorch's SDPA per bucket
    (exact * weights).sum().backward()
    q, k, v = qkv(tokens)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fast = segment_attention(q, k, v, plan, None)
        (fast.float() * weights).sum().backward()
    assert fast.dtype == torch.bfloat16
    if idle:  # nothing attended to or from the padding: its output is zero, and its inputs get no gradient
        assert (fast[0, -2:] == 0).all() and (exact[0, -2:] == 0).all()
        assert all((t.grad[0, :, -2:] == 0).all() for t in (q, k, v))
    torch.testing.assert_close(fast.float(), exact, atol=3e-2, rtol=3e-2)
    for a, b in zip((q, k, v), (exact_q, exact_k, exact_v)):
        assert a.grad.dtype == a.dtype and (a.grad - b.grad).norm() < 0.02 * b.grad.norm()
    ref_q, ref_k, ref_v = qkv(tokens)
    reference = autograd_formulation(ref_q, ref_k, ref_v.to(torch.bfloat16), plan)
    (reference.float() * weights).sum().backward()
    assert torch.equal(fast, reference)  # the same operations in the same precision
    torch.testing.assert_close(q.grad, ref_q.grad, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(k.grad, ref_k.grad, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(v.grad, ref_v.grad, atol=1e-2, rtol=1e-2)  # autograd summed these in bf16


def test_bf16_attention_by_segments_drops_weights_only_in_training():
    plan, tokens = shared_prompt_plan()
    q, k, v = qkv(tokens)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = segment_attention(q, k, v, plan, None)
        torch.manual_seed(3)
        dropped = segment_attention(q, k, v, plan, None, dropout=0.5)
        torch.manual_seed(3)
        again = segment_attention(q, k, v, plan, None, dropout=0.5)
    assert torch.equal(dropped, again) and not torch.equal(dropped, plain) and torch.isfinite(dropped).all()
    dropped.float().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_a_coarse_plan_runs_buckets_of_one_padded_shape_as_one():
    segments = [([], list(range(10 * i, 10 * i + 9 - i))) for i in range(6)]  # own lengths 9 down to 4
    idle = [p for p in range(60) if all(p not in own for _, own in segments)]
    fine = plan_segments(segments, 60, idle=idle)
    coarse = plan_segments(segments, 60, grain=8, idle=idle)
    assert [b.queries.shape for b in fine.buckets] == [(2, 9), (2, 7), (2, 5)]
    assert [b.queries.shape for b in coarse.buckets] == [(8, 16), (8, 8)]  # 7 and 5 both pad to 8: one bucket
    assert int((coarse.order == sum(b.queries.numel() for b in coarse.buckets)).sum()) == len(idle)
    with pytest.raises(ValueError, match="exactly once"):  # an idle position that a segment owns
        plan_segments(segments, 60, idle=idle + [0])


@pytest.mark.parametrize("idle", [False, True])
def test_fp32_attention_by_segments_as_matmuls_is_the_kernels_to_rounding(idle):
    plan, tokens = shared_prompt_plan(grain=4 if idle else 1, idle=idle)
    weights = torch.randn(1, tokens, 4, 8)
    results = []
    for attend in (matmul_segment_attention, kernel_segment_attention):
        q, k, v = qkv(tokens)
        out = attend(q, k, v, plan, None)
        (out * weights).sum().backward()
        results.append((out, q.grad, k.grad, v.grad))
    (fast, *fast_grads), (exact, *exact_grads) = results
    assert fast.dtype == torch.float32
    torch.testing.assert_close(fast, exact, atol=1e-6, rtol=1e-5)
    for a, b in zip(fast_grads, exact_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_past_its_budget_of_keys_attention_by_segments_runs_the_kernel_at_fp32(monkeypatch):
    """Under bf16 autocast the matmul path keeps each bucket's softmax weights for the backward; a
    plan whose queries see more keys on average than the budget runs PyTorch's kernel per bucket
    instead, at fp32. An fp32 forward always runs the kernel (its numbers stay the kernel's)."""
    plan, tokens = shared_prompt_plan()
    keys = keys_per_query(plan)
    assert keys == sum(b.allowed.numel() for b in plan.buckets) / tokens and 1 < keys < matmul_segments.MATMUL_ATTENTION_KEYS[torch.bfloat16]
    kernel_calls = []
    real_kernel = segments_module.kernel_segment_attention
    monkeypatch.setattr(segments_module, "kernel_segment_attention",
                        lambda q, *a, **kw: kernel_calls.append(q.dtype) or real_kernel(q, *a, **kw))
    outs = []
    for budget in (keys, keys - 0.01):
        monkeypatch.setitem(matmul_segments.MATMUL_ATTENTION_KEYS, torch.bfloat16, budget)
        q, k, v = qkv(tokens)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs.append(segments_module.segment_attention(q, k, v, plan, None))
        outs[-1].float().sum().backward()
        assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    assert kernel_calls == [torch.float32]  # only past the budget, and at fp32
    assert outs[0].dtype == outs[1].dtype == torch.bfloat16
    torch.testing.assert_close(outs[0].float(), outs[1].float(), atol=3e-2, rtol=3e-2)
    q, k, v = qkv(tokens)
    segments_module.segment_attention(q, k, v, plan, None)
    assert kernel_calls == [torch.float32, torch.float32]  # fp32: the kernel, whatever the budget
