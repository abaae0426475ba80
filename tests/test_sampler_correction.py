"""The trainer-side correction for an external sampler: pi_old, TIS weights and the figures."""

import copy
import math

import pytest
import torch

from lmpo.rollout import LocalEngine, left_pad
from lmpo.rollout.weight_probe import StaleWeightsError, default_probe_ids
from lmpo.trainers.sampler_mismatch import (correct_for_sampler, recompute_logprobs, samples_with_trainer_forward,
                                            sync_and_probe)


def test_correction_uses_the_trainers_logprobs_and_reports_the_mismatch():
    sampler = torch.tensor([[math.log(0.25), math.log(0.3), math.log(0.6), 0.0]])
    trainer = torch.tensor([[math.log(0.5), math.log(0.9), math.log(0.3), -5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    old, weights, figures = correct_for_sampler(sampler, trainer, mask, cap=2.0)
    assert torch.equal(old, trainer)
    torch.testing.assert_close(weights, torch.tensor([[2.0, 2.0, 0.5, 0.0]]))
    assert figures["tis_weight_mean"] == pytest.approx(4.5 / 3)
    assert figures["tis_clipped_frac"] == pytest.approx(1 / 3)
    ratios = [2.0, 3.0, 0.5]
    assert figures["mismatch_kl"] == pytest.approx(sum(r - 1 - math.log(r) for r in ratios) / 3, rel=1e-5)
    assert figures["mismatch_kl_k1"] == pytest.approx(sum(-math.log(r) for r in ratios) / 3, rel=1e-5)


def test_no_reweighting_with_cap_zero_and_nothing_to_correct_when_equal():
    lp = torch.tensor([[-1.0, -2.0]])
    mask = torch.tensor([[1.0, 0.0]])
    _, weights, figures = correct_for_sampler(lp - 0.5, lp, mask, cap=0)
    assert weights.tolist() == [[1.0, 0.0]] and figures["tis_clipped_frac"] == 0.0
    _, weights, figures = correct_for_sampler(lp, lp.clone(), mask, cap=2.0)
    assert weights.tolist() == [[1.0, 0.0]]
    assert figures["mismatch_kl"] == 0.0 and figures["tis_weight_mean"] == 1.0


def test_recompute_in_chunks_matches_one_forward(tiny_llama, char_tokenizer):
    tok = char_tokenizer
    prompts = [tok(s, add_special_tokens=False).input_ids for s in ["12=", "345=", "6="]]
    prompt_ids, prompt_mask = left_pad(prompts, tok.pad_token_id)
    completion = torch.randint(10, 30, (3, 4), generator=torch.Generator().manual_seed(0))
    whole = recompute_logprobs(tiny_llama, prompt_ids, prompt_mask, completion, 0.7)
    chunked = recompute_logprobs(tiny_llama, prompt_ids, prompt_mask, completion, 0.7, chunk=2)
    torch.testing.assert_close(whole, chunked)
    assert whole.shape == (3, 4) and not whole.requires_grad


def test_sync_and_probe(tiny_llama, char_tokenizer):
    tok = char_tokenizer
    policy = copy.deepcopy(tiny_llama)
    engine = LocalEngine(copy.deepcopy(policy), tok.eos_token_id, tok.pad_token_id)
    assert samples_with_trainer_forward(engine) and not samples_with_trainer_forward(object())
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    probe = default_probe_ids(tok)

    class NoSync(LocalEngine):
        def sync_weights(self, model):  # the bug the probe exists for: a sync that never arrives
            pass

    broken = NoSync(engine.model, tok.eos_token_id, tok.pad_token_id)
    with pytest.raises(StaleWeightsError):
        sync_and_probe(broken, policy, probe, 0.1)
    figures = sync_and_probe(engine, policy, probe, 0.1)
    assert figures["probe_max_abs_diff"] < 1e-6 and "probe_mean_abs_diff" in figures
    assert sync_and_probe(engine, policy, probe, 0) == {}


def test_engine_options_are_validated():
    from lmpo.trainers.rl_config import RLConfig
    from lmpo.trainers.validation import ConfigError

    RLConfig(engine="vllm", tis_cap=0, probe_tolerance=0).validate()
    for bad, match in [({"engine": "sglang"}, "engine='sglang'"), ({"tis_cap": 0.5}, "tis_cap=0.5"),
                       ({"probe_tolerance": -1.0}, "probe_tolerance"),
                       ({"vllm_gpu_memory_utilization": 1.0}, "vllm_gpu_memory_utilization")]:
        with pytest.raises(ConfigError, match=match):
            RLConfig(**bad).validate()
