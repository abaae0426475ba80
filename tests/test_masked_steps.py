"""A step in which no token is trained (every episode masked, say each one ended on a length
limit): its token means (entropy, KL, loss, clip fraction) are not measurements, so they are not
logged; the collapse guard and the doctor do not read them as an entropy collapse."""

from __future__ import annotations

import json

import pytest

from lmpo.reports.doctor_runs import diagnose_run
from lmpo.trainers import rl as rl_module
from lmpo.trainers.rl import train_rl
from lmpo.trainers.rl_config import RLConfig

TOKEN_FIGURES = ("entropy", "kl", "loss", "policy_loss", "clip_frac")


def test_a_step_without_trained_tokens_logs_no_token_means_and_raises_no_alarm(start_model, tmp_path, monkeypatch):
    real_make_batch, calls = rl_module.make_batch, []

    def second_step_all_masked(*args, **kwargs):
        batch = real_make_batch(*args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            batch.loss_mask = batch.loss_mask * 0
        return batch

    monkeypatch.setattr(rl_module, "make_batch", second_step_all_masked)
    out = tmp_path / "rl"
    train_rl(RLConfig(model=start_model, out=str(out), steps=3, prompts_per_step=2, group_size=4, max_new_tokens=6,
                      eval_problems=0, beta=0.04, target_kl=0.01, save_every=1, threads=1, collapse_guard=True,
                      rewards="reward_fns:length=1.0"))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert not [r for r in rows if "rollback" in r]  # was: "entropy collapse: entropy 0.0000 < 0.1 x ..."
    assert [r["step"] for r in rows] == [1, 2, 3]
    masked = rows[1]
    assert masked["trained_tokens"] == 0 and not [k for k in TOKEN_FIGURES if k in masked]
    assert masked["beta"] == rows[2]["beta"]  # the adaptive KL coefficient had no KL to adapt to
    for row in (rows[0], rows[2]):
        assert row["trained_tokens"] > 0 and all(k in row for k in TOKEN_FIGURES) and row["entropy"] > 1.0
    assert "entropy_collapse" not in [f.code for f in diagnose_run(out)["rl"]]


class CountingCollectives:
    """A two-process stand-in, the other process adding 1 to every sum (it trained tokens), that
    counts the collectives this process enters: with torchrun every process must enter the same
    ones, whether or not its own share trained any token."""

    active, world = True, 2

    def __init__(self):
        self.calls = 0

    def all_sum(self, value: float) -> float:
        self.calls += 1
        return value + 1.0

    def gather(self, value):
        self.calls += 1
        return [value, value]

    def all_true(self, flag: bool) -> bool:
        self.calls += 1
        return False  # the other process disagrees


def test_every_process_enters_the_same_collectives_whether_or_not_its_share_trained_a_token(start_model, tmp_path,
                                                                                              monkeypatch):
    """`value_mean` and `kl_reward` became absent on a process whose share was all masked; with
    the per-key sums over processes, that process would have entered fewer collectives than the
    others (a hang). They are now sums over every process's tokens."""
    from dataclasses import replace

    import torch

    from lmpo.trainers.rl import step_figures
    from lmpo.trainers.rl_batch import compute_advantages

    captured = []
    real_make_batch = rl_module.make_batch
    monkeypatch.setattr(rl_module, "make_batch", lambda *a, **k: captured.append((a[0], real_make_batch(*a, **k)))
                        or captured[-1][1])
    cfg = RLConfig(model=start_model, out=str(tmp_path / "rl"), steps=1, prompts_per_step=2, group_size=4,
                   max_new_tokens=6, eval_problems=0, save_every=0, threads=1, rewards="reward_fns:length=1.0")
    train_rl(cfg)
    scored, trained = captured[0]
    trained.old_values = torch.zeros_like(trained.loss_mask)
    trained.ref_logprobs = trained.old_logprobs - 0.1
    masked = replace(trained, loss_mask=trained.loss_mask * 0)
    reward_kl = replace(cfg, kl_placement="reward", beta=0.05)
    counts, figures = [], []
    for batch in (trained, masked):
        ctx = CountingCollectives()
        figures.append({**step_figures(scored, batch, ctx), **compute_advantages(batch, scored, reward_kl, 0.05, ctx)})
        counts.append(ctx.calls)
    assert counts[0] == counts[1]
    assert figures[0].keys() == figures[1].keys() and {"value_mean", "kl_reward"} <= figures[1].keys()
    tokens = trained.loss_mask.sum().item()
    assert figures[0]["kl_reward"] == pytest.approx((0.1 * tokens + 1) / (tokens + 1))  # over both processes' tokens


def test_a_process_whose_episodes_got_no_env_reward_still_enters_the_env_rewards_sum(start_model, tmp_path,
                                                                                     monkeypatch):
    """`reward_env` is a figure where a process's episodes got an environment reward; a process
    whose episodes got none left it out and entered one sum fewer than the others (a hang)."""
    import torch

    from lmpo.trainers.rl import step_figures

    captured = []
    real_make_batch = rl_module.make_batch
    monkeypatch.setattr(rl_module, "make_batch", lambda *a, **k: captured.append((a[0], real_make_batch(*a, **k)))
                        or captured[-1][1])
    train_rl(RLConfig(model=start_model, out=str(tmp_path / "rl"), steps=1, prompts_per_step=2, group_size=4,
                      max_new_tokens=6, eval_problems=0, save_every=0, threads=1, rewards="reward_fns:length=1.0"))
    scored, batch = captured[0]
    counts, figures = [], []
    for env in (torch.full((len(scored.rewards),), 0.5), None):
        scored.components.pop("env", None)
        if env is not None:
            scored.components["env"] = env
        ctx = CountingCollectives()
        figures.append(step_figures(scored, batch, ctx))
        counts.append(ctx.calls)
    assert counts[0] == counts[1] and figures[0].keys() == figures[1].keys()
    assert figures[1]["reward_env"] == 0.5  # (0 here + the stand-in's 1) / 2 processes
