"""The options added for configurations ported from TRL / verl reach the algorithms, and the
validation rejects them where the selected part does not read them."""

from __future__ import annotations

import json
import math

import pytest
import torch

from lmpo.algos import grpo, masked_whiten, whiten_sequences
from lmpo.trainers.preference import PreferenceConfig, preference_options
from lmpo.trainers.rl_batch import Batch, Scored, compute_advantages
from lmpo.trainers.rl_config import RLConfig
from lmpo.trainers.rl_update import LossParts
from lmpo.trainers.runtime import options_for
from lmpo.trainers.validation import ConfigError


@pytest.mark.parametrize("settings", [
    {"loss": "dpo=0.8,bco_pair=0.2,sft=1"}, {"loss": "robust", "label_smoothing": 0.2},
    {"loss": "exo_pair", "label_smoothing": 1e-3}, {"loss": "discopop", "discopop_tau": 0.1},
    {"loss": "cdpo=1,discopop=0.5", "label_smoothing": 0.2, "discopop_tau": 0.1}, {"loss": "aot_pair"},
    {"loss": "sft"}, {"loss": "dpo=1,sft=1", "beta": 0.5},
])
def test_preference_configs_that_work(settings):
    PreferenceConfig(**settings).validate()


@pytest.mark.parametrize("settings,match", [
    ({"loss": "dpo=0.8,kto=0.2"}, "unknown preference loss 'kto'"),
    ({"loss": "dpo=0.8,dpo=0.2"}, "given twice"),
    ({"loss": "dpo=-1"}, "must be a finite number > 0"),
    ({"loss": "hinge", "label_smoothing": 0.2}, r"label_smoothing=0.2 is not used by loss=hinge"),
    ({"loss": "dpo", "discopop_tau": 0.1}, r"discopop_tau=0.1 is not used by loss=dpo"),
    ({"loss": "dpo=1,sft=1", "gamma": 1.0}, r"gamma=1.0 is not used by loss=dpo=1,sft=1"),
    ({"loss": "exo_pair", "label_smoothing": 0.0}, r"exo_pair takes log\(label_smoothing\)"),
    ({"loss": "discopop", "discopop_tau": 0.0}, r"discopop_tau=0.0 must be > 0"),
    ({"loss": "sft", "beta": 0.5}, r"beta=0.5: loss=sft does not read beta"),
    ({"loss": "sft=2", "beta": 0.5}, r"loss=sft does not read beta"),
])
def test_preference_configs_that_fail(settings, match):
    with pytest.raises(ConfigError, match=match):
        PreferenceConfig(**settings).validate()


def test_preference_options_reach_the_loss():
    from lmpo.algos import PREFERENCE_LOSSES

    cfg = PreferenceConfig(loss="cdpo=1,discopop=0.5", label_smoothing=0.2, discopop_tau=0.3)
    fn = PREFERENCE_LOSSES.get(cfg.loss)
    assert options_for(fn, preference_options(cfg)) == {"label_smoothing": 0.2, "discopop_tau": 0.3}
    assert options_for(PREFERENCE_LOSSES.get("hinge"), preference_options(cfg)) == {}


@pytest.mark.parametrize("settings,match", [
    ({"advantage": "rloo", "advantage_eps": 1e-4}, "advantage_eps=0.0001 is not used by advantage=rloo"),
    ({"ratio_cap": 5.0}, r"ratio_cap=5.0 is not used by loss=ppo_clip"),
    ({"loss": "gspo", "ratio_level": "sequence"}, r"ratio_level='sequence' is not used by loss=gspo"),
    ({"loss": "cispo", "ratio_cap": 5.0, "clip_eps_high": 0.28}, "ratio_cap=5.0 replaces the clip range"),
    ({"loss": "cispo", "ratio_cap": -1.0}, "ratio_cap=-1.0 must be > 0"),
    ({"whiten_over": "sequences"}, "whiten_over='sequences' is not used by whiten_advantages=False"),
    ({"whiten_advantages": True, "whiten_over": "sequences", "advantage": "reinforce_pp"},
     "whiten_over=sequences needs a per-sequence advantage"),
    ({"advantage_eps": -1.0}, "advantage_eps=-1.0 and whiten_eps=1e-08 must be >= 0"),
    # options that did nothing and were accepted in silence
    ({"scale": "none", "std": "population"}, "std=population: scale=none divides by nothing"),
    ({"scale": "none", "advantage_eps": 1e-3}, "advantage_eps=0.001: scale=none divides by nothing"),
    ({"beta": 0.05, "kl_placement": "reward"}, "kl_estimator=k3 with kl_placement=reward: the reward penalty is "
                                               "always k1"),
    ({"beta": 0.0, "kl_estimator": "k2"}, "kl_estimator=k2 estimates the KL term, but beta=0: there is none"),
])
def test_rl_option_conflicts(settings, match):
    with pytest.raises(ConfigError, match=match):
        RLConfig(**settings).validate()


def test_every_preset_passes_and_so_does_a_kl_preset_with_beta_0():
    from lmpo.trainers.presets import RL_PRESETS
    for preset in RL_PRESETS.values():
        RLConfig(**preset.settings).validate()
        RLConfig(**{**preset.settings, "beta": 0.0}).validate()  # `lmpo train ppo --beta 0`
    RLConfig(beta=0.05, kl_placement="reward", kl_estimator="k1").validate()


def test_rl_options_reach_the_loss_parts():
    RLConfig(loss="cispo", ratio_cap=5.0, ratio_level="sequence", kl_estimator="k3_ratio", beta=0.04).validate()
    parts = LossParts.from_config(RLConfig(loss="cispo", ratio_cap=5.0, ratio_level="sequence",
                                           kl_estimator="k3_ratio"))
    assert options_for(parts.policy_loss, parts.options) == {"clip_eps_low": 0.2, "clip_eps_high": 0.2,
                                                             "ratio_cap": 5.0, "ratio_level": "sequence"}
    assert options_for(parts.kl, {"old_logprobs": 1}) == {"old_logprobs": 1}
    # the defaults pass no cap to cispo
    assert LossParts.from_config(RLConfig(loss="cispo")).options["ratio_cap"] is None


def _batch_and_scored(rewards, groups, valid=None):
    n = len(rewards)
    mask = torch.tensor([[1.0] * (i % 3 + 1) + [0.0] * (3 - i % 3) for i in range(n)])
    batch = Batch(torch.zeros(n, 1, dtype=torch.long), torch.ones(n, 1), torch.zeros(n, 4, dtype=torch.long), mask,
                  torch.zeros(n, 4))
    scored = Scored(None, [], torch.tensor(groups), torch.tensor(rewards, dtype=torch.float32), {}, [], 0, 0,
                    valid=valid)
    return batch, scored


def test_advantage_eps_and_whitening_reach_the_batch():
    rewards, groups = [0.9, 0.6, 0.2, 0.0, 1.0, 0.0, 0.5, 0.5], [0, 0, 0, 0, 1, 1, 1, 1]
    batch, scored = _batch_and_scored(rewards, groups)
    compute_advantages(batch, scored, RLConfig(advantage_eps=1e-4), 0.0)
    expected = grpo(scored.rewards, scored.group_ids, eps=1e-4)
    torch.testing.assert_close(batch.advantages[:, 0], expected)
    # the default is today's: eps 1e-6, no whitening
    batch, scored = _batch_and_scored(rewards, groups)
    compute_advantages(batch, scored, RLConfig(), 0.0)
    torch.testing.assert_close(batch.advantages[:, 0], grpo(scored.rewards, scored.group_ids))
    # TRL's RLOO normalisation: per sequence, sample std, eps 1e-4; unscorable rows left out
    valid = torch.tensor([True] * 7 + [False])
    batch, scored = _batch_and_scored(rewards, groups, valid)
    cfg = RLConfig(advantage="rloo", whiten_advantages=True, whiten_over="sequences", whiten_eps=1e-4,
                   whiten_std="sample")
    compute_advantages(batch, scored, cfg, 0.0)
    from lmpo.algos import advantages_of_valid, rloo

    raw = advantages_of_valid(rloo, scored.rewards, scored.group_ids, valid)
    expected = whiten_sequences(raw, valid, eps=1e-4, unbiased=True)
    torch.testing.assert_close(batch.advantages, expected[:, None].expand(8, 4))
    assert batch.advantages[7].abs().sum() == 0
    kept = raw[:7].double()
    assert batch.advantages[0, 0].item() == pytest.approx(
        ((kept[0] - kept.mean()) / (kept.std() + 1e-4)).item(), rel=1e-5)
    # per token (the default way), with the new eps / std options
    batch, scored = _batch_and_scored(rewards, groups)
    compute_advantages(batch, scored, RLConfig(advantage="rloo", whiten_advantages=True, whiten_std="sample"), 0.0)
    raw = rloo(scored.rewards, scored.group_ids)[:, None].expand(8, 4)
    torch.testing.assert_close(batch.advantages, masked_whiten(raw, batch.loss_mask, unbiased=True))


def test_weighted_preference_loss_trains(start_model, tmp_path):
    from lmpo.cli.main import main

    out = tmp_path / "mpo"
    assert main(["train", "dpo", "--loss", "dpo=0.8,bco_pair=0.2,sft=1", "--model", start_model, "--out", str(out),
                 "--pairs", "16", "--batch_size", "8", "--eval_problems", "0", "--log_every", "1",
                 "--threads", "1"]) == 0
    steps = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert len(steps) == 2 and {"loss_dpo", "loss_bco_pair", "loss_sft"} <= set(steps[0])
    first = steps[0]
    # policy == reference at the start: dpo = log 2, bco_pair = 2 log 2 (all rewards 0, delta 0)
    assert first["loss_dpo"] == pytest.approx(math.log(2), abs=1e-5)
    assert first["loss_bco_pair"] == pytest.approx(2 * math.log(2), abs=1e-5)
    assert first["loss"] == pytest.approx(0.8 * first["loss_dpo"] + 0.2 * first["loss_bco_pair"] + first["loss_sft"],
                                          rel=1e-5)


def test_rl_runs_with_the_ported_options(start_model, tmp_path):
    """TRL-style CISPO (absolute cap, sequence ratio), bias-corrected KL, TRL's eps and per-sequence
    whitening, through the real loop, with two passes so that the ratio moves off 1."""
    from lmpo.trainers.rl import train_rl

    cfg = RLConfig(model=start_model, out=str(tmp_path / "run"), steps=2, prompts_per_step=2, group_size=4,
                   prompt_pool=32, max_new_tokens=6, eval_problems=0, save_every=0, lr=1e-3, warmup_steps=1,
                   threads=1, loss="cispo", ratio_cap=5.0, ratio_level="sequence", kl_estimator="k3_ratio",
                   beta=0.04, advantage_eps=1e-4, whiten_advantages=True, whiten_over="sequences",
                   whiten_eps=1e-4, whiten_std="sample", num_iterations=2, aggregation="token_mean")
    train_rl(cfg)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "kl" in r]
    assert len(steps) == 2 and all(math.isfinite(r["kl"]) and r["kl"] >= 0 for r in steps)


@pytest.mark.parametrize("loss", ["robust", "hinge", "exo_pair", "nca_pair", "bco_pair", "sppo_hard", "aot",
                                  "aot_pair", "apo_zero", "apo_down", "discopop", "sft"])
def test_every_new_preference_loss_trains(loss, start_model, tmp_path):
    from lmpo.trainers.preference import train_preference

    out = tmp_path / loss
    options = {"label_smoothing": 0.001} if loss == "exo_pair" else {}
    train_preference(PreferenceConfig(loss=loss, model=start_model, out=str(out), pairs=8, batch_size=8,
                                      eval_problems=0, log_every=1, threads=1, **options))
    steps = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert len(steps) == 1 and math.isfinite(steps[0]["loss"])
