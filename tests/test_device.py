"""Devices, precision, chunked log-probs, micro-batches and gradient checkpointing."""

from __future__ import annotations

import copy
import ctypes
import os
import subprocess
import sys
import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import lmpo.models.device as device_mod
from lmpo.models import (autocast, choose_precision, completion_outputs, enable_gradient_checkpointing, micro_batches,
                         parameter_counts, resolve_device)
from lmpo.models.memory import is_checkpointing
from lmpo.models.padding import left_pad

CPU = torch.device("cpu")


def test_resolve_device():
    assert resolve_device("cpu") == CPU
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        for spec in ("cuda", "cuda:1"):
            with pytest.raises(ValueError, match="sees no CUDA GPU"):
                resolve_device(spec)


def test_cpu_precision_is_fp32_and_bf16_falls_back_with_a_warning(monkeypatch):
    for requested in ("auto", "fp32"):
        p = choose_precision(CPU, requested)
        assert (p.param_dtype, p.autocast_dtype, p.name) == (torch.float32, None, "fp32")
    monkeypatch.setattr(device_mod, "cpu_has_native_bf16", lambda: False)
    with pytest.warns(RuntimeWarning, match="no native bf16"):
        assert choose_precision(CPU, "bf16").autocast_dtype is None
    monkeypatch.setattr(device_mod, "cpu_has_native_bf16", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = choose_precision(CPU, "bf16")
    assert (p.param_dtype, p.autocast_dtype) == (torch.float32, torch.bfloat16) and "master weights" in p.description
    with pytest.raises(ValueError, match="unknown precision"):
        choose_precision(CPU, "fp16")


def _batch(tok, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [[tok.bos_token_id] + torch.randint(10, 60, (n,), generator=g).tolist() for n in (3, 6, 1)]
    prompt_ids, prompt_mask = left_pad(prompts, tok.pad_token_id)
    return prompt_ids, prompt_mask, torch.randint(10, 60, (3, 7), generator=g)


def test_logprobs_are_fp32_under_bf16_autocast(tiny_llama, char_tokenizer):
    batch = _batch(char_tokenizer)
    bf16 = device_mod.Precision(torch.float32, torch.bfloat16, "bf16")
    with torch.no_grad():
        exact = completion_outputs(tiny_llama, *batch, entropy=True)
        with autocast(bf16, CPU):
            assert torch.ones(2, 2).matmul(torch.ones(2, 2)).dtype == torch.bfloat16
            low = completion_outputs(tiny_llama, *batch, entropy=True)
        with autocast(choose_precision(CPU, "fp32"), CPU):
            assert torch.ones(2, 2).matmul(torch.ones(2, 2)).dtype == torch.float32
    assert low.logprobs.dtype == low.entropy.dtype == torch.float32
    assert 0 < (low.logprobs - exact.logprobs).abs().max() < 0.1


@pytest.mark.parametrize("fixture", ["tiny_llama", "tiny_qwen2"])  # tied embeddings; untied head
@pytest.mark.parametrize("chunk", [5, 64])
def test_chunked_logprobs_equal_the_unchunked_ones_with_gradients(request, char_tokenizer, fixture, chunk):
    model = request.getfixturevalue(fixture)
    assert model.config.tie_word_embeddings == (fixture == "tiny_llama")
    batch = _batch(char_tokenizer)
    weights = torch.linspace(-1, 1, 21).view(3, 7)
    params = [p for p in model.parameters() if p.requires_grad]
    results = []
    for chunk_tokens in (0, chunk):
        out = completion_outputs(model, *batch, temperature=0.7, entropy_grad=True, hidden=True, chunk_tokens=chunk_tokens)
        loss = (out.logprobs * weights).sum() + 0.1 * out.entropy.sum()
        results.append((out, torch.autograd.grad(loss, params)))
    (full, full_grads), (chunked, chunked_grads) = results
    assert full.logprobs.shape == chunked.logprobs.shape == (3, 7) and full.logprobs.max() < 0
    torch.testing.assert_close(chunked.logprobs, full.logprobs, atol=1e-6, rtol=0)
    torch.testing.assert_close(chunked.entropy, full.entropy, atol=1e-6, rtol=0)
    torch.testing.assert_close(chunked.hidden, full.hidden, atol=1e-6, rtol=0)
    assert sum(g.abs().sum() for g in full_grads) > 0
    for a, b in zip(chunked_grads, full_grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(completion_outputs(model, *batch, 0.7, chunk_tokens=chunk).logprobs, full.logprobs,
                                   atol=1e-6, rtol=0)


def test_micro_batches_respect_the_token_budget():
    lengths = [5, 30, 12, 30, 7, 1, 19, 40]
    batches = micro_batches(lengths, max_tokens=64)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert batches == [[7], [1, 3], [6, 2, 4], [0, 5]]
    assert all(len(b) * max(lengths[i] for i in b) <= 64 for b in batches)
    assert micro_batches([100, 3], max_tokens=50) == [[0], [1]]  # an over-long row goes alone
    assert micro_batches([], 10) == []
    with pytest.raises(ValueError):
        micro_batches([1], 0)


def _fresh_llama(tok) -> LlamaForCausalLM:
    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    return LlamaForCausalLM(config)


def test_gradient_checkpointing_gives_the_same_gradients(char_tokenizer):
    plain = _fresh_llama(char_tokenizer).train()
    checkpointed = enable_gradient_checkpointing(copy.deepcopy(plain)).train()
    assert is_checkpointing(checkpointed) and checkpointed.config.use_cache is False
    assert not is_checkpointing(plain)
    batch = _batch(char_tokenizer, seed=1)
    grads = []
    for model in (plain, checkpointed):
        loss = -completion_outputs(model, *batch).logprobs.mean()
        grads.append(torch.autograd.grad(loss, list(model.parameters())))
    assert sum(g.abs().sum() for g in grads[0]) > 0
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_parameter_counts(tiny_llama):
    counts = parameter_counts(tiny_llama)
    n = sum(p.numel() for p in tiny_llama.parameters())
    assert counts.total == counts.trainable == n and counts.bytes == 4 * n
    assert f"{n:,} of {n:,}" in counts.describe()


def test_a_saved_model_on_the_cpu_switches_modes_without_kernelizing(start_model, char_tokenizer, monkeypatch):
    """transformers loads a saved model with hub kernels on; on the CPU (no kernel in their
    mapping) lmpo turns them off, so that train() / eval() do not kernelize the model again."""
    import transformers.modeling_utils as modeling_utils

    from lmpo.models import load_model, without_cpu_hub_kernels

    model = load_model(start_model, char_tokenizer)
    calls = []
    real = modeling_utils.PreTrainedModel.set_use_kernels
    monkeypatch.setattr(modeling_utils.PreTrainedModel, "set_use_kernels",
                        lambda self, *a, **k: calls.append(a) or real(self, *a, **k))
    if model.use_kernels:  # the transformers version loads with hub kernels on
        model.train(), model.eval()
        assert calls, "transformers no longer kernelizes on a mode switch: the helper may be unnecessary"
    without_cpu_hub_kernels(model)
    calls.clear()
    model.train(), model.eval()
    assert not model.use_kernels and not calls
    x = torch.tensor([[3, 4, 5]])
    torch.testing.assert_close(model(x).logits, load_model(start_model, char_tokenizer).eval()(x).logits)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("top_k", [0, 5])
def test_sampling_on_the_gpu_draws_from_the_trainers_cpu_generator(top_k):
    """The trainers sample with a CPU generator (its state resumes on any device); on a GPU the
    draws must come from it, and match the CPU's."""
    from lmpo.rollout.sampling import sample_next
    from lmpo.rollout.types import SamplingParams

    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1))
    params = SamplingParams(temperature=0.8, top_k=top_k)
    on_gpu = sample_next(logits.cuda(), params, torch.Generator().manual_seed(3))
    on_cpu = sample_next(logits, SamplingParams(temperature=0.8, top_k=top_k or 50), torch.Generator().manual_seed(3))
    assert torch.equal(on_gpu[0].cpu(), on_cpu[0])
    assert torch.allclose(on_gpu[1].cpu(), on_cpu[1], atol=1e-5)


_FAULTS_SCRIPT = """
import resource, sys, torch
from lmpo.models.device import reuse_freed_host_memory
print(reuse_freed_host_memory())
for _ in range(2):  # 48 MiB, above the 32 MiB that glibc's own threshold can reach; the heap grows to it
    torch.empty(12 << 20).fill_(1.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    torch.empty(12 << 20).fill_(1.0)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "gnu_get_libc_version"), reason="glibc only")
@pytest.mark.parametrize("user_setting", [None, "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"])
def test_freed_host_memory_is_reused_unless_the_user_set_malloc(user_setting):
    """A freed 48 MiB buffer allocated again, 10 times: faulted in anew each time under glibc's
    defaults (12,288 pages each), reused after `reuse_freed_host_memory` (where the heap's layout
    leaves the freed buffer a few bytes short of the aligned request, once more); a user's own
    malloc settings win."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    if user_setting == "MALLOC_TRIM_THRESHOLD_":
        env[user_setting] = "131072"
    elif user_setting == "GLIBC_TUNABLES":
        env[user_setting] = "glibc.malloc.trim_threshold=131072"
    out = subprocess.run([sys.executable, "-c", _FAULTS_SCRIPT], env=env, capture_output=True, text=True, check=True)
    reused, faults = out.stdout.split()
    if user_setting is None:
        assert reused == "True" and int(faults) < 3 * 12_288
    else:
        assert reused == "False" and int(faults) >= 10 * 12_288
