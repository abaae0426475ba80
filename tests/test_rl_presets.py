import json

import pytest
import torch
from safetensors.torch import load_file

from lmpo.cli.main import main
from lmpo.trainers.presets import RL_PRESETS
from lmpo.trainers.rl import train_rl
from lmpo.trainers.rl_batch import Scored, compute_advantages, make_batch
from lmpo.trainers.rl_config import RLConfig
from lmpo.rollout import Rollout


def _cfg(preset, model, out, **kw):
    base = dict(RL_PRESETS[preset].settings)
    base.update(model=model, out=str(out), steps=2, prompts_per_step=2, group_size=4, prompt_pool=64,
                max_new_tokens=6, eval_problems=8, eval_every=2, save_every=0, threads=1, rewards="correct=1.0,format=0.5")
    base.update(kw)
    return RLConfig(**base)


@pytest.mark.parametrize("preset", sorted(RL_PRESETS))
def test_every_preset_runs_and_logs(preset, start_model, tmp_path):
    cfg = _cfg(preset, start_model, tmp_path / preset, dynamic_sampling=False)
    result = train_rl(cfg)
    rows = [json.loads(line) for line in (tmp_path / preset / "metrics.jsonl").read_text().splitlines()][1:]
    assert len(rows) == 2 and all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    saved = json.loads((tmp_path / preset / "result.json").read_text())
    assert saved["models_held"]["reference"] == int(cfg.beta > 0)
    assert saved["models_held"]["critic"] == cfg.critic and saved["peak_rss_mb"] > 0
    if cfg.critic != "none":
        assert "value_loss" in rows[0] and (tmp_path / preset / "critic.safetensors").exists()
        _loads_as_the_readme_says(tmp_path / preset, cfg.critic)
    assert result.accuracy is not None


def _loads_as_the_readme_says(run, critic):
    """README's "Run directories": critic.safetensors' keys, and how it loads back."""
    from transformers import AutoModelForCausalLM

    from lmpo.models.value import ValueModel

    keys = set(load_file(str(run / "critic.safetensors")))
    if critic == "head":
        assert keys == {"linear.weight", "linear.bias"}
        return
    assert {"head.linear.weight", "head.linear.bias"} <= keys and {k.split(".")[0] for k in keys} == {"trunk", "head"}
    ValueModel(AutoModelForCausalLM.from_pretrained(run / "model")).load(run / "critic.safetensors")


@pytest.mark.parametrize("critic", ["separate", "head"])
def test_ppo_resume_restores_the_critic_exactly(critic, start_model, tmp_path, monkeypatch):
    from lmpo.trainers import rl as rl_module

    kw = dict(steps=4, save_every=2, critic=critic)
    train_rl(_cfg("ppo", start_model, tmp_path / "whole", **kw))
    _loads_as_the_readme_says(tmp_path / "whole", critic)
    real_update, calls = rl_module.update, {"n": 0}

    def crashing_update(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated crash")
        return real_update(*args, **kwargs)

    monkeypatch.setattr(rl_module, "update", crashing_update)
    with pytest.raises(RuntimeError):
        train_rl(_cfg("ppo", start_model, tmp_path / "crashed", **kw))
    monkeypatch.setattr(rl_module, "update", real_update)
    train_rl(_cfg("ppo", start_model, tmp_path / "x", resume=str(tmp_path / "crashed"), **kw))
    for name in ("model/model.safetensors", "critic.safetensors"):
        a, b = load_file(str(tmp_path / "whole" / name)), load_file(str(tmp_path / "crashed" / name))
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_dynamic_sampling_gives_a_clear_error_when_no_group_has_signal(start_model, tmp_path):
    # a random model never sorts correctly: every group's rewards are all 0
    cfg = _cfg("dapo", start_model, tmp_path / "d", rewards="correct=1.0", max_sampling_rounds=2)
    with pytest.raises(RuntimeError, match="after 2 rounds only 0 of 2 groups"):
        train_rl(cfg)


def _scored(rewards, lengths, truncated, width=4):
    n = len(rewards)
    mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).float()
    rollout = Rollout([[5, 6]] * n, torch.full((n, width), 7), mask, -torch.ones(n, width) * mask,
                      ["length" if t else "eos" for t in truncated], 0, torch.tensor(lengths))
    return Scored(rollout, [None] * n, torch.tensor([0, 0, 1, 1][:n]), torch.tensor(rewards), {}, [], 2, 0)


def test_overlong_mask_removes_truncated_completions_from_the_loss():
    scored = _scored([1.0, 0.0, 1.0, 0.0], [2, 4, 3, 4], [False, True, False, True])
    batch = make_batch(scored, RLConfig(overlong="mask", max_new_tokens=4), pad_id=0)
    assert batch.loss_mask.sum(dim=1).tolist() == [2, 0, 3, 0]


def test_kl_as_reward_penalty_reaches_sequence_and_token_estimators():
    scored = _scored([1.0, 0.0, 1.0, 0.0], [2, 2, 3, 3], [False] * 4)
    batch = make_batch(scored, RLConfig(), pad_id=0)
    batch.ref_logprobs = batch.old_logprobs - 0.5 * batch.loss_mask  # k1 = 0.5 per token
    cfg = RLConfig(advantage="dr_grpo", kl_placement="reward", beta=0.2)
    compute_advantages(batch, scored, cfg, beta=0.2)
    # dr_grpo on R - beta*sum(k1): [1-0.2, 0-0.2] -> +-0.5 in group 0, [1-0.3, 0-0.3] -> +-0.5 in group 1
    assert torch.allclose(batch.advantages[:, 0], torch.tensor([0.5, -0.5, 0.5, -0.5]))
    tok_cfg = RLConfig(advantage="reinforce_pp", kl_placement="reward", beta=0.2)
    compute_advantages(batch, scored, tok_cfg, beta=0.2)
    returns = batch.returns
    # return at the first token = R - beta * 0.5 * (tokens from here on)
    assert torch.allclose(returns[:, 0], torch.tensor([1 - 0.2, 0 - 0.2, 1 - 0.3, 0 - 0.3]), atol=1e-6)


def test_presets_command_lists_every_preset(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    for name, preset in RL_PRESETS.items():
        assert name in out and preset.source.split(",")[0] in out


def test_train_rl_with_a_preset_and_overrides(start_model, tmp_path):
    assert main(["train", "rl", "--preset", "gspo", "--advantage", "rloo", "--model", start_model,
                 "--out", str(tmp_path / "r"), "--steps", "1", "--prompts_per_step", "2", "--group_size", "2",
                 "--eval_problems", "4", "--threads", "1"]) == 0
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    assert cfg["loss"] == "gspo" and cfg["advantage"] == "rloo" and cfg["clip_eps_high"] == 4e-4
