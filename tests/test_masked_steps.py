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


def mask_every_token_of_the_second_step(monkeypatch) -> None:
    real_make_batch, calls = rl_module.make_batch, []

    def second_step_all_masked(*args, **kwargs):
        batch = real_make_batch(*args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            batch.loss_mask = batch.loss_mask * 0
        return batch

    monkeypatch.setattr(rl_module, "make_batch", second_step_all_masked)


def test_a_step_without_trained_tokens_logs_no_token_means_and_raises_no_alarm(start_model, tmp_path, monkeypatch):
    mask_every_token_of_the_second_step(monkeypatch)
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


def test_a_step_without_trained_tokens_leaves_the_weights_as_they_were(start_model, tmp_path, monkeypatch):
    """With no trained token the gradients are zero, yet an optimizer step would still move the
    weights (Adam's momentum from the step before, weight decay): no step is taken."""
    real_update, moved = rl_module.update, []

    def watched_update(policy, *args, **kwargs):
        before = [p.detach().clone() for p in policy.parameters()]
        stats = real_update(policy, *args, **kwargs)
        moved.append(max((p.detach() - b).abs().max().item() for p, b in zip(policy.parameters(), before)))
        return stats

    mask_every_token_of_the_second_step(monkeypatch)
    monkeypatch.setattr(rl_module, "update", watched_update)
    train_rl(RLConfig(model=start_model, out=str(tmp_path / "rl"), steps=3, prompts_per_step=2, group_size=4,
                      max_new_tokens=6, eval_problems=0, num_minibatches=2, threads=1,
                      rewards="reward_fns:length=1.0"))
    assert moved[0] > 0 and moved[2] > 0
    assert moved[1] == 0.0


class CountingCollectives:
    """A two-process stand-in, the other process adding 1 to every sum (it trained tokens), that
    counts the collectives this process enters: with torchrun every process must enter the same
    ones, whether or not its own share trained any token."""

    active, world = True, 2

    def __init__(self, other_figures: dict | None = None):
        self.calls, self.other_figures = 0, other_figures or {}

    def all_sum(self, value: float) -> float:
        self.calls += 1
        return value + 1.0

    def gather(self, value):
        """The other process's object: this one's with 1 added to every number (and, in a dict of
        figures, `other_figures` beside them)."""
        self.calls += 1

        def other(obj):
            if isinstance(obj, dict):
                return {**{k: other(v) for k, v in obj.items()}, **self.other_figures}
            if isinstance(obj, tuple):
                return tuple(other(v) for v in obj)
            return obj + 1 if isinstance(obj, (int, float)) and not isinstance(obj, bool) else obj

        return [value, other(value)]

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

    from lmpo.trainers.rl_figures import step_figures
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

    from lmpo.trainers.rl_figures import step_figures

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
        ctx = CountingCollectives(other_figures={"reward_env": 1.0, "only_there": 2.0})
        figures.append(step_figures(scored, batch, ctx))
        counts.append(ctx.calls)
    assert counts[0] == counts[1] and figures[0].keys() == figures[1].keys()
    assert figures[1]["reward_env"] == 0.5  # (0 here + the stand-in's 1) / 2 processes
    assert figures[0]["reward_env"] == 0.75  # (0.5 here + the other's 1) / 2
    assert counts == [1, 1] and figures[1]["only_there"] == 2.0  # one gather; a figure one process lacks: the others'



def test_two_processes_figures_merge_by_what_each_figure_is(monkeypatch):
    """Under torchrun each process ran one collective per figure it had: a reason for unscorable
    completions, or an episode end, that only one process saw made the two wait on different
    collectives for ever (QA: env errors on rank 0 only). The agent figures (terminations, tool
    calls, turns) were rank 0's alone. Now one gather; counts are sums, shares of a termination
    0 where a process had none, the others means."""
    from types import SimpleNamespace

    import torch

    from lmpo.trainers.rl_figures import step_figures

    mine = {"reward_mean": 0.5, "unscorable": 0, "groups_sampled": 4, "completion_len_max": 9,
            "termination_answered": 1.0, "turns_mean": 1.0}
    theirs = {"reward_mean": 1.0, "unscorable": 2, "unscorable_timeout": 2, "groups_sampled": 4,
              "completion_len_max": 12, "termination_answered": 0.5, "termination_env_error": 0.5,
              "turns_mean": 2.0, "reward_env": 1.0}
    monkeypatch.setattr("lmpo.trainers.rl_figures._local_step_figures", lambda scored, batch: dict(mine))
    ctx = CountingCollectives()
    ctx.gather = lambda obj: [obj, (theirs, 0.0, 5)]
    figures = step_figures(None, SimpleNamespace(old_values=None, loss_mask=torch.ones(1, 3)), ctx)
    assert figures == {"reward_mean": 0.75, "unscorable": 2, "groups_sampled": 8, "completion_len_max": 12,
                       "termination_answered": 0.75, "turns_mean": 1.5, "unscorable_timeout": 2,
                       "termination_env_error": 0.25, "reward_env": 0.5}
