"""The weight-sync probe on CPU: an engine holding a copy of the policy that was not synced
after an optimizer step fails it; after `sync_weights` it passes."""

import copy

import pytest
import torch

from lmpo.models import completion_outputs
from lmpo.rollout import LocalEngine
from lmpo.rollout.weight_probe import StaleWeightsError, compare_logprobs, default_probe_ids, probe_engine
from lmpo.trainers.rl_config import RLConfig


def _one_step(policy, probe):
    """An ordinary optimizer step that makes the probe sequence more likely."""
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    ids = torch.tensor([probe])
    out = completion_outputs(policy, ids[:, :1], torch.ones(1, 1, dtype=torch.long), ids[:, 1:])
    (-out.logprobs.sum()).backward()
    optimizer.step()


def test_an_unsynced_engine_fails_the_probe_and_passes_after_sync(tiny_llama, char_tokenizer):
    tok = char_tokenizer
    policy = copy.deepcopy(tiny_llama).train()
    engine = LocalEngine(copy.deepcopy(policy), tok.eos_token_id, tok.pad_token_id)
    probe = default_probe_ids(tok)
    tolerance = RLConfig().probe_tolerance
    assert probe_engine(engine, policy, probe, tolerance).max_abs_diff < 1e-6
    _one_step(policy, probe)
    with pytest.raises(StaleWeightsError, match=r"tolerance .*weights other than the trainer's.*sync_weights"):
        probe_engine(engine, policy, probe, tolerance)
    engine.sync_weights(policy)
    result = probe_engine(engine, policy, probe, tolerance)
    assert result.max_abs_diff < 1e-6 and result.tokens == len(probe) - 1
    assert policy.training  # the probe leaves the trainer's mode as it was


def test_local_engine_score_matches_the_sampled_logprobs(tiny_llama, char_tokenizer):
    from lmpo.rollout import SamplingParams

    tok = char_tokenizer
    engine = LocalEngine(tiny_llama, tok.eos_token_id, tok.pad_token_id, generator=torch.Generator().manual_seed(0))
    prompt = tok("31415=", add_special_tokens=False).input_ids
    sample = engine.generate([prompt], SamplingParams(max_new_tokens=6))[0]
    assert engine.score(prompt, sample.token_ids) == pytest.approx(sample.logprobs, abs=1e-4)


def test_default_probe_ids():
    from lmpo.models import build_char_tokenizer

    tok = build_char_tokenizer()
    ids = default_probe_ids(tok, max_tokens=16)
    assert len(ids) == 16 and tok.unk_token_id not in ids
    assert default_probe_ids(tok, "12+34=46") == tok("12+34=46", add_special_tokens=False).input_ids
    narrow = build_char_tokenizer("0123456789")  # the stock sentence is mostly unknown here
    spread = default_probe_ids(narrow, "é", max_tokens=8)
    assert len(spread) >= 2 and not set(spread) & set(narrow.all_special_ids)


def test_compare_logprobs_and_bad_inputs(tiny_llama, char_tokenizer):
    assert compare_logprobs([-1.0, -2.0], [-1.5, -2.0]).mean_abs_diff == pytest.approx(0.25)
    assert compare_logprobs([-1.0, float("-inf")], [-1.0, -2.0]).max_abs_diff == float("inf")
    engine = LocalEngine(tiny_llama, char_tokenizer.eos_token_id, char_tokenizer.pad_token_id)
    with pytest.raises(ValueError, match="more than 1"):
        probe_engine(engine, tiny_llama, [5], 0.1)
    with pytest.raises(TypeError, match="no score"):
        probe_engine(object(), tiny_llama, [5, 6], 0.1)
