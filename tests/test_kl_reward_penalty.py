"""The KL as a reward penalty (ppo, reinforce_pp, `--kl_placement reward`) compares the trainer's own
log-probs with the reference's, so it is exactly 0 while the policy is the reference.

Before: it used the sampler's log-probs (the KV-cached decoder's), which differ from the
trainer's full forward by float error: at step 1 `kl_reward` was -8.3e-5 under bf16 while `kl`
read 0, and with every reward equal the group normalisation or the token whitening turned that
noise into advantages up to 0.94 (reinforce_pp) and 1.42 (grpo with the KL in the reward)."""

from __future__ import annotations

import json

import pytest
import torch

from lmpo.cli.main import main
from lmpo.trainers.rl_batch import Batch, Scored, compute_advantages
from lmpo.trainers.rl_config import RLConfig

REWARD = '''
def varied(task, problems, completions, terminated):
    return [float(sum(map(ord, c)) % 7) / 7.0 for c in completions]
'''


def _batch(sampler_noise: float):
    torch.manual_seed(0)
    mask = torch.ones(8, 5)
    ref = -torch.rand(8, 5)
    batch = Batch(torch.zeros(8, 1, dtype=torch.long), torch.ones(8, 1), torch.zeros(8, 5, dtype=torch.long), mask,
                  old_logprobs=ref + sampler_noise * torch.randn(8, 5), ref_logprobs=ref, policy_logprobs=ref.clone())
    scored = Scored(None, [], torch.arange(8) // 4, torch.zeros(8), {}, [], 2, 2)
    return batch, scored


@pytest.mark.parametrize("options", [dict(advantage="grpo", kl_placement="reward", kl_estimator="k1", beta=0.04),
                                     dict(advantage="reinforce_pp", kl_placement="reward", kl_estimator="k1",
                                          whiten_advantages=True, beta=0.01)])
def test_sampler_noise_never_becomes_kl_or_advantage(options):
    batch, scored = _batch(sampler_noise=1e-2)  # bf16-sized gap between the sampler and the trainer
    figures = compute_advantages(batch, scored, RLConfig(**options), options["beta"])
    assert figures["kl_reward"] == 0.0 and bool((batch.advantages == 0).all())
    batch, scored = _batch(sampler_noise=1e-2)
    batch.policy_logprobs = None  # another engine sampled: old_logprobs are the trainer's recomputed ones
    figures = compute_advantages(batch, scored, RLConfig(**options), options["beta"])
    assert figures["kl_reward"] != 0.0  # they are what the penalty reads then


@pytest.mark.parametrize("command", [["ppo"], ["ppo", "--critic", "head"], ["reinforce_pp"],
                                     ["grpo", "--kl_placement", "reward", "--kl_estimator", "k1"],
                                     # the reference is the policy with its adapter off: its forward ran
                                     # padded where the policy's ran packed, -2e-8 at step 1 (QA U)
                                     ["reinforce_pp", "--lora_r", "4"]])
def test_the_first_steps_kl_reward_is_exactly_zero_and_later_ones_are_not(tmp_path, monkeypatch, command):
    (tmp_path / "qa_reward.py").write_text(REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    out = tmp_path / "run"
    assert main(["train", *command, "--model", "tiny", "--steps", "3", "--prompts_per_step", "2", "--group_size", "4",
                 "--eval_problems", "0", "--save_every", "0", "--threads", "1", "--reward_timeout", "0",
                 "--rewards", "qa_reward:varied=1.0", "--lr", "1e-2", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    kl = [row["kl_reward"] for row in rows if "kl_reward" in row]
    assert kl[0] == 0.0 and any(value != 0.0 for value in kl[1:]), kl
