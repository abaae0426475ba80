"""The compiled decoding kernels against PyTorch references, and the build's fallbacks."""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from lmpo.rollout import SamplingParams, generate, kernels
from lmpo.rollout.sampling import sample_next

KERNELS = kernels.load()
needs_kernels = pytest.mark.skipif(KERNELS is None, reason="no C compiler: the PyTorch path is used")


@needs_kernels
def test_rms_norm_and_silu_mul_match_pytorch():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(7, 48, generator=gen) * 3
    assert torch.allclose(KERNELS.rms_norm(x, 1e-5), F.rms_norm(x, (48,), None, 1e-5), rtol=1e-5, atol=1e-6)
    gate_up = torch.randn(5, 2 * 40, generator=gen) * 4
    gate_up[0, :6] = torch.tensor([-200.0, -88.0, -30.0, 0.0, 30.0, 200.0])  # exp's clamps, both ends
    gate, up = gate_up.chunk(2, dim=-1)
    assert torch.allclose(KERNELS.silu_mul(gate_up), F.silu(gate) * up, rtol=2e-6, atol=1e-6)


@needs_kernels
def test_rms_norm_and_silu_mul_on_several_threads_give_the_one_thread_result_bit_for_bit():
    gen = torch.Generator().manual_seed(1)
    gate_up = torch.randn(67, 2 * 1024, generator=gen) * 4  # rows split unevenly; enough to share
    x = torch.randn(67, 512, generator=gen) * 3
    gate, up = gate_up.chunk(2, dim=-1)
    one, norm_one = KERNELS.silu_mul(gate_up, threads=1), KERNELS.rms_norm(x, 1e-6, threads=1)
    assert torch.allclose(one, F.silu(gate) * up, rtol=2e-6, atol=1e-6)
    assert torch.allclose(norm_one, F.rms_norm(x, (512,), None, 1e-6), rtol=1e-5, atol=1e-6)
    for threads in (2, 3):
        assert torch.equal(KERNELS.silu_mul(gate_up, threads=threads), one)
        assert torch.equal(KERNELS.rms_norm(x, 1e-6, threads=threads), norm_one)


@needs_kernels
def test_kernels_refuse_tensors_they_would_misread():
    with pytest.raises(ValueError, match="'x': expected a contiguous torch.float32 CPU tensor"):
        KERNELS.rms_norm(torch.randn(8, 4).t(), 1e-5)
    with pytest.raises(ValueError, match="'gate_up'"):
        KERNELS.silu_mul(torch.randn(2, 8, dtype=torch.float64))


@needs_kernels
def test_exp_is_exact_at_minus_infinity_and_keeps_nan():
    gate_up = torch.tensor([[float("nan"), float("-inf"), float("inf"), 1.0, 1.0, 1.0, 1.0, 1.0]])
    out = KERNELS.silu_mul(gate_up)  # silu(g) = g / (1 + exp(-g))
    assert math.isnan(out[0, 0]) and out[0, 2] == float("inf") and out[0, 3] == pytest.approx(F.silu(torch.tensor(1.0)).item())
    assert math.isnan(out[0, 1]) == math.isnan((F.silu(torch.tensor(float("-inf")))).item())


def _rotate_half(x):
    half = x.size(-1) // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


@needs_kernels
@pytest.mark.parametrize("n_heads,n_kv,dim", [(4, 4, 32), (4, 2, 16), (2, 1, 64)])
@pytest.mark.parametrize("length", [0, 5, 15, 16, 17, 40])
def test_decode_attention_matches_a_pytorch_reference(n_heads, n_kv, dim, length):
    gen = torch.Generator().manual_seed(length)
    batch, total = 5, 48
    qkv = torch.randn(batch, (n_heads + 2 * n_kv) * dim, generator=gen)
    keys = torch.randn(batch * n_kv, total, dim, generator=gen)  # already rotated
    values = torch.randn(batch * n_kv, total, dim, generator=gen)
    bias = torch.full((batch * n_kv, 1, total), float("-inf"))
    bias[:, :, : length + 1] = 0.0
    bias[: n_kv, :, :2] = float("-inf")  # the first sequence's prompt starts with two pads
    if length < 2:
        bias[: n_kv, :, length] = 0.0
    position = torch.tensor([length, length + 3, 7, 1, length])
    cos, sin = torch.randn(total + 8, dim, generator=gen), torch.randn(total + 8, dim, generator=gen)

    k_cache = kernels.blocked_keys(keys.transpose(1, 2).contiguous())
    v_cache = values.clone()
    out = KERNELS.decode_attention(qkv, n_heads * dim, (n_heads + n_kv) * dim, position, cos, sin, k_cache,
                                   v_cache, bias, length, n_heads, n_kv)
    # the same step again with two threads sharing the sequences: bit for bit the same
    k_again, v_again = kernels.blocked_keys(keys.transpose(1, 2).contiguous()), values.clone()
    split = KERNELS.decode_attention(qkv, n_heads * dim, (n_heads + n_kv) * dim, position, cos, sin, k_again,
                                     v_again, bias, length, n_heads, n_kv, threads=2)
    assert torch.equal(split, out) and torch.equal(k_again, k_cache) and torch.equal(v_again, v_cache)

    c, s = cos[position][:, None], sin[position][:, None]
    q = qkv[:, : n_heads * dim].view(batch, n_heads, dim)
    k = qkv[:, n_heads * dim: (n_heads + n_kv) * dim].view(batch, n_kv, dim)
    v = qkv[:, (n_heads + n_kv) * dim:].view(batch, n_kv, dim)
    q, k = q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s
    keys.view(batch, n_kv, total, dim)[:, :, length] = k
    values.view(batch, n_kv, total, dim)[:, :, length] = v
    group = n_heads // n_kv
    scores = torch.einsum("bhd,bhtd->bht", q, keys.view(batch, n_kv, total, dim).repeat_interleave(group, 1))
    scores = scores * dim ** -0.5 + bias.view(batch, n_kv, total).repeat_interleave(group, 1)
    expected = torch.einsum("bht,bhtd->bhd", scores.softmax(-1),
                            values.view(batch, n_kv, total, dim).repeat_interleave(group, 1))
    assert torch.allclose(out.view(batch, n_heads, dim), expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(v_cache, values), "the new value is written at `length`"
    assert torch.allclose(k_cache, kernels.blocked_keys(keys.transpose(1, 2).contiguous()), atol=1e-6)


@needs_kernels
def test_sampling_kernel_draws_what_the_pytorch_path_draws(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(256, 40, generator=gen) * 3
    logits[:, 7] = float("-inf")  # a token that may never be drawn
    for params in (SamplingParams(temperature=0.7), SamplingParams(temperature=1.0), SamplingParams(temperature=0.0)):
        fast = sample_next(logits, params, torch.Generator().manual_seed(1))
        monkeypatch.setattr(kernels, "load", lambda: None)
        slow = sample_next(logits, params, torch.Generator().manual_seed(1))
        monkeypatch.undo()
        assert (fast[0] != 7).all()
        assert (fast[0] == slow[0]).float().mean() > 0.99  # a draw exactly on a CDF edge may differ
        same = fast[0] == slow[0]
        assert torch.allclose(fast[1][same], slow[1][same], atol=1e-5)


@needs_kernels
def test_engine_with_and_without_kernels_agrees(monkeypatch, tiny_qwen2, char_tokenizer):
    tok = char_tokenizer
    prompts = [tok(t).input_ids for t in ["12=", "3+4=", "987654321=", "5"]] * 3
    params = SamplingParams(temperature=1.0, max_new_tokens=30)

    def run():
        return generate(tiny_qwen2, prompts, params, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id,
                        generator=torch.Generator().manual_seed(3), backend="fast")

    fast = run()
    monkeypatch.setattr(kernels, "load", lambda: None)
    slow = run()
    assert torch.equal(fast.completion_ids, slow.completion_ids)
    assert torch.allclose(fast.logprobs, slow.logprobs, atol=1e-5)


def test_build_is_cached_and_a_failing_compiler_falls_back(monkeypatch, tmp_path):
    monkeypatch.setenv("LMPO_KERNEL_CACHE", str(tmp_path))
    if kernels._compiler() is not None:
        first = kernels.build(kernels._compiler())
        stamp = first.stat().st_mtime_ns
        assert kernels.build(kernels._compiler()) == first and first.stat().st_mtime_ns == stamp
        assert [p.name for p in tmp_path.iterdir()] == [first.name], "no partial files are left behind"
    monkeypatch.setenv("CC", "false")  # a "compiler" that always fails
    monkeypatch.setattr(kernels, "_compiler", lambda: "false")
    kernels.load.cache_clear()
    try:
        monkeypatch.setenv("LMPO_KERNEL_CACHE", str(tmp_path / "other"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert kernels.load() is None
        assert any("PyTorch path" in str(w.message) for w in caught)
        kernels.load.cache_clear()
        monkeypatch.setenv("LMPO_DECODE_KERNELS", "0")
        assert kernels.load() is None
    finally:
        kernels.load.cache_clear()


@needs_kernels
def test_attention_threads_and_forked_children():
    """Thousands of calls sharing rows among threads, with pauses between them, give what one
    thread gives; a forked child (whose OpenMP pool is gone) still computes it, single-threaded."""
    import os
    import signal
    import time

    batch, n_heads, dim, total = 4, 2, 16, 32
    qkv = torch.randn(batch, 4 * n_heads * dim)
    k_cache, v_cache = torch.zeros(batch * n_heads, total // 16, dim, 16), torch.zeros(batch * n_heads, total, dim)
    bias = torch.zeros(batch * n_heads, 1, total)
    position = torch.zeros(batch, dtype=torch.long)
    cos, sin = torch.ones(total, dim), torch.zeros(total, dim)

    def step(threads):
        return KERNELS.decode_attention(qkv, n_heads * dim, 2 * n_heads * dim, position, cos, sin, k_cache, v_cache,
                                        bias, 3, n_heads, n_heads, threads=threads)

    expected = step(1)
    for i in range(2000):
        assert torch.equal(step(2), expected)
        if i == 1000:
            time.sleep(0.01)  # the pool's threads go to sleep and must be woken
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)  # a hang in the child fails the test instead of stalling it
        os._exit(0 if torch.equal(step(2), expected) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
