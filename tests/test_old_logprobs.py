"""π_old of an RL update: for a batch's first update (the only one, or the first minibatch of the
first pass), the loss forward's own (the ratio is exactly 1, tests/test_packed.py); for the later
ones, the trainer's forward before the first update (the first minibatch's rows keep their own)."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from lmpo.models import completion_outputs

from test_packed import batch, tiny


@pytest.mark.parametrize("iterations,minibatches", [(2, 1), (1, 2)])
def test_several_updates_take_pi_old_from_the_trainers_forward(iterations, minibatches):
    """With several updates per batch π_old is the trainer's forward before the first update, not
    the sampler's log-probs (which differ by float error, in bf16 by ~1e-2): the first update's
    ratio is 1 up to the float error between two forwards of the trainer."""
    from lmpo.trainers.rl import old_log_probs_and_values
    from lmpo.trainers.rl_batch import Batch
    from lmpo.trainers.rl_config import RLConfig

    model = tiny(Qwen2ForCausalLM, Qwen2Config, False, "sdpa")
    prompt, prompt_mask, completion, lengths = batch()
    loss_mask = (torch.arange(9) < lengths[:, None]).float()
    trainer = completion_outputs(model, prompt, prompt_mask, completion).logprobs.detach()
    sampler = trainer + 1e-2  # the sampler's own kernels and precision
    cfg = RLConfig(beta=0.0, num_iterations=iterations, num_minibatches=minibatches)
    part = Batch(prompt, prompt_mask, completion, loss_mask, sampler.clone(), on_policy=True)
    old_log_probs_and_values(part, None, None, model, cfg)
    torch.testing.assert_close(part.old_logprobs * loss_mask, trainer * loss_mask, atol=1e-5, rtol=0)
    once = Batch(prompt, prompt_mask, completion, loss_mask, sampler.clone(), on_policy=True)
    old_log_probs_and_values(once, None, None, model, RLConfig(beta=0.0))  # one update: its own forward serves
    assert torch.equal(once.old_logprobs, sampler) and once.policy_logprobs is None


@pytest.mark.parametrize("preset,options", [("ppo", {}), ("ppo", {"critic": "head"}),
                                            ("grpo", {"num_minibatches": 2, "beta": 0.0}),
                                            ("ppo", {"micro_batch_tokens": 64})])
def test_the_first_minibatch_of_several_updates_has_a_ratio_of_exactly_one(preset, options, start_model, tmp_path,
                                                                          monkeypatch):
    """The first minibatch trains the weights that sampled the batch: its π_old is its own forward and
    its ratio exactly 1. It took the log-prob pass's, which laid the whole batch out with its prompts
    packed once while the 4-row minibatch ran padded: the ppo preset (separate critic) saw
    |log ratio| up to 4.8e-7 there. The later passes keep that π_old for those rows."""
    from lmpo.algos import POLICY_LOSSES
    from lmpo.trainers.presets import RL_PRESETS
    from lmpo.trainers.rl import train_rl
    from lmpo.trainers.rl_config import RLConfig

    seen = []

    class Watched:
        @staticmethod
        def get(name):
            loss = POLICY_LOSSES.get(name)

            def watched(new, old, advantages, mask, **kw):
                seen.append((new.detach() - old)[mask != 0])
                return loss(new, old, advantages, mask, **kw)
            watched.__signature__ = __import__("inspect").signature(loss)
            return watched

    monkeypatch.setattr("lmpo.trainers.rl_update.POLICY_LOSSES", Watched)
    settings = {**RL_PRESETS[preset].settings, **options}
    train_rl(RLConfig(**settings, model=start_model, out=str(tmp_path / "run"), steps=1, prompts_per_step=2,
                      group_size=4, prompt_pool=64, max_new_tokens=6, eval_problems=0, save_every=0, threads=1))
    updates = settings.get("num_iterations", 1) * settings.get("num_minibatches", 1)
    calls_per_update = len(seen) // updates
    first = torch.cat(seen[:calls_per_update])
    assert len(seen) == calls_per_update * updates and first.numel() and first.abs().max() == 0


@pytest.mark.parametrize("micro_batch_tokens", [0, 40])
def test_later_passes_keep_the_first_minibatchs_pi_old(micro_batch_tokens):
    """With the weights held still, every pass over the batch sees a ratio of exactly 1: the second
    takes for π_old what the first one's forward gave, not the log-prob pass's (here 1e-3 off)."""
    from lmpo.trainers.rl_batch import Batch
    from lmpo.trainers.rl_config import RLConfig
    from lmpo.trainers.rl_update import LossParts, update

    model = tiny(Qwen2ForCausalLM, Qwen2Config, False, "sdpa")
    prompt, prompt_mask, completion, lengths = batch()
    loss_mask = (torch.arange(9) < lengths[:, None]).float()
    before = completion_outputs(model, prompt, prompt_mask, completion).logprobs.detach() + 1e-3
    part = Batch(prompt, prompt_mask, completion, loss_mask, before.clone(), advantages=torch.randn(5, 9),
                 on_policy=True)
    cfg = RLConfig(beta=0.0, num_iterations=2, micro_batch_tokens=micro_batch_tokens)
    parts = LossParts.from_config(cfg)
    seen = []
    loss = parts.policy_loss
    parts.policy_loss = lambda new, old, adv, mask, **k: seen.append((new - old).detach()[mask != 0]) or \
        loss(new, old, adv, mask, **k)

    class Still:  # an optimizer step that leaves the weights as they are
        skipped, lr = 0, 0.0

        def zero(self):
            model.zero_grad()

        def apply(self, finite):
            return True, 0.0

    update(model, Still(), part, cfg, parts, 0.0)
    assert len(seen) >= 2 and torch.cat(seen).numel() == 2 * loss_mask.sum() and (torch.cat(seen) == 0).all()
    assert not torch.equal(part.old_logprobs, before)  # π_old is the first update's forward now


def test_the_sampler_is_measured_against_the_trainers_forward(start_model, tmp_path, monkeypatch):
    """The on-policy ratio is 1 by construction (π_old is the update's own forward), so a sampler
    that drew from another distribution would go unseen (QA R). `sampler_kl` measures the engine's
    behaviour log-probs against that forward: float error with the built-in engine, and plain to
    see when the sampler is off (here its log-probs taken at another temperature)."""
    import json

    from lmpo.trainers import rl as rl_module
    from lmpo.trainers.rl import train_rl
    from lmpo.trainers.rl_config import RLConfig

    def run(out, skew: float):
        real = rl_module.make_batch

        def skewed(*args, **kwargs):
            made = real(*args, **kwargs)
            made.sampler_logprobs = made.sampler_logprobs * skew  # log-probs of a sharper sampler
            return made

        monkeypatch.setattr(rl_module, "make_batch", skewed)
        train_rl(RLConfig(model=start_model, out=str(tmp_path / out), steps=2, prompts_per_step=2, group_size=4,
                          max_new_tokens=6, eval_problems=0, save_every=0, threads=1, num_minibatches=2))
        return [json.loads(line)["sampler_kl"] for line in (tmp_path / out / "metrics.jsonl").read_text().splitlines()]

    assert all(0 <= kl < 1e-6 for kl in run("same", 1.0))
    assert all(kl > 1e-2 for kl in run("off", 1.5))


def test_sampler_kl_at_float_error_is_quiet_and_a_sampler_drawing_elsewhere_is_named():
    """The doctor reads it: bf16 autocast leaves 1e-6 to 1e-5 between the engine's log-probs and the forward's; a
    sampler at another temperature leaves far more, which the ratio (1 by construction) hides."""
    from lmpo.reports.doctor import diagnose

    rows = [{"step": i + 1, "reward_mean": 0.5, "zero_var_frac": 0.3, "accuracy": 0.5, "sampler_kl": 1e-5 * i / 29}
            for i in range(30)]
    assert "sampler_mismatch" not in {f.code for f in diagnose(rows, "rl")}
    rows = [{**row, "sampler_kl": 0.0} for row in rows]
    rows[4]["sampler_kl"], rows[7]["sampler_kl"] = 0.004, 0.05
    found = next(f for f in diagnose(rows, "rl") if f.code == "sampler_mismatch")
    assert found.value == "0.05 nats/token at step 8 (2 steps above the threshold)"
