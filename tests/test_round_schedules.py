"""Online DPO and RFT index their learning-rate schedule by rounds: a round forms anywhere from no
pair (no kept sample) to one per prompt, so a schedule planned in updates stopped short of its
end; by rounds, the decay reaches `min_lr_ratio` in the last round whatever the rounds formed."""

from __future__ import annotations

import json
import math

import pytest
import torch

import lmpo.trainers.rft as rft
from lmpo.trainers.online_dpo import OnlineDPOConfig, train_online_dpo
from lmpo.trainers.runtime import make_scheduler, schedule_at

VERIFIER = "reward_fns:count_sevens=1.0"  # a random model writes a 7 in some samples and not others


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _cosine(position: int, warmup: int, total: int, ratio: float = 0.1) -> float:
    if position < warmup:
        return (position + 1) / warmup
    progress = min(1.0, (position - warmup) / max(1, total - warmup))
    return ratio + (1 - ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def test_schedule_at_sets_the_rate_of_any_position():
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
    scheduler = make_scheduler(optimizer, 2, 10, "cosine", 0.1)
    for position in (7, 0, 10, 3):  # any order: a pure function of the position
        schedule_at(scheduler, position)
        expected = 1e-3 * _cosine(position, 2, 10)
        assert scheduler.get_last_lr()[0] == pytest.approx(expected, rel=1e-12)
        assert optimizer.param_groups[0]["lr"] == scheduler.get_last_lr()[0] and scheduler.last_epoch == position


def test_online_dpo_ends_its_decay_in_the_last_round_however_few_pairs_form(start_model, tmp_path):
    out = tmp_path / "odpo"
    # 4 rounds of 8 prompts, batch 2: planned in updates that was 16 steps; a round forms fewer pairs
    train_online_dpo(OnlineDPOConfig(model=start_model, out=str(out), rounds=4, prompts_per_round=8,
                                     samples_per_prompt=4, max_new_tokens=48, batch_size=2, lr=1e-3, warmup_steps=1,
                                     lr_schedule="cosine", min_lr_ratio=0.1, rewards=VERIFIER, reward_timeout=0,
                                     eval_problems=0, save_every=0, threads=1))
    rows = [r for r in _rows(out) if "round" in r]
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    assert any(r["pairs"] < 8 for r in rows) and any(r.get("updates") for r in rows)
    # round r at position r - 1 of a schedule over rounds - 1 places: round 4 at min_lr_ratio x lr
    assert [r["lr"] for r in rows] == pytest.approx([1e-3 * _cosine(r - 1, 1, 3) for r in (1, 2, 3, 4)], rel=1e-9)
    assert rows[-1]["lr"] == pytest.approx(1e-4, rel=1e-9)


def test_rft_rounds_that_keep_nothing_still_move_the_schedule_on(start_model, tmp_path, monkeypatch):
    real, calls = rft.accepted_samples, []

    def nothing_in_round_1(*args, **kwargs):  # round 1 keeps no sample: no SFT step in it
        calls.append(1)
        return [] if len(calls) == 1 else real(*args, **kwargs)

    monkeypatch.setattr(rft, "accepted_samples", nothing_in_round_1)
    out = tmp_path / "rft"
    rft.train_rft(rft.RFTConfig(model=start_model, out=str(out), rounds=3, prompts_per_round=6, samples_per_prompt=4,
                                prompt_pool=40, max_new_tokens=48, accept_threshold=float("-inf"),
                                rewards=VERIFIER, reward_timeout=0, sft_steps_per_round=2, batch_size=4, lr=1e-3,
                                lr_schedule="cosine", eval_problems=0, save_every=0, threads=1))
    rows = [r for r in _rows(out) if "kept" in r]
    assert rows[0]["kept"] == 0 and "lr" not in rows[0] and rows[1]["kept"] and rows[2]["kept"]
    assert [r["updates"] for r in rows] == [0, 2, 4]  # the updates applied, not the schedule's place
    # round K's last step at place K·2 - 1 of 6 (the rate a step uses is logged): round 1 counted
    assert [rows[1]["lr"], rows[2]["lr"]] == pytest.approx([1e-3 * _cosine(p, 0, 6) for p in (3, 5)], rel=1e-9)


def test_online_dpo_that_forms_no_pair_because_every_sample_was_cut_off_says_so(start_model, tmp_path, capsys):
    """A cut-off sample is never chosen: with every sample cut at --max_new_tokens no pair formed,
    and the run and the doctor blamed ties and advised a reward model (QA T, with a reward model)."""
    from lmpo.reports.doctor import diagnose

    out = tmp_path / "odpo"
    train_online_dpo(OnlineDPOConfig(model=start_model, out=str(out), rounds=2, prompts_per_round=4,
                                     samples_per_prompt=4, max_new_tokens=1, batch_size=2, rewards=VERIFIER,
                                     reward_timeout=0, eval_problems=0, save_every=0, threads=1))
    rows = [r for r in _rows(out) if "round" in r]
    assert all(r["unended_frac"] >= 0.5 and r["tie_frac"] + r["unended_frac"] + r["pairs"] / 4 == 1 for r in rows)
    assert not any(r["pairs"] for r in rows)  # the seed's samples: not one ended after one token
    assert "no sample ended before --max_new_tokens 1, and a cut-off sample is never chosen" in capsys.readouterr().out
    (found,) = [f for f in diagnose(rows, "online_dpo") if f.code == "no_updates"]
    assert "cut off at --max_new_tokens" in found.message and found.remedy.startswith("raise --max_new_tokens")


def test_online_dpo_or_rft_that_never_trained_is_a_finding():
    """Every round tied (online DPO) or accepted nothing (RFT): the run exited 0, saved the start
    model byte for byte, and the doctor said "no problems found"."""
    from lmpo.reports.doctor import diagnose

    def warnings(rows, stage):
        return {f.code for f in diagnose(rows, stage) if f.severity == "warning"}

    rft = [{"step": r, "reward_mean": 0.0, "acceptance_rate": 0.0, "kept": 0, "updates": 0} for r in (1, 2)]
    odpo = [{"step": r, "reward_mean": 0.0, "pairs": 0, "optimizer_steps": 0} for r in (1, 2)]
    (found,) = [f for f in diagnose(rft, "rft") if f.code == "no_updates"]
    assert found.metric == "updates" and "no sample was accepted" in found.message
    (found,) = [f for f in diagnose(odpo, "online_dpo") if f.code == "no_updates"]
    assert found.metric == "optimizer_steps" and "no pair was formed" in found.message
    rft[-1]["updates"] = 16
    odpo[-1]["optimizer_steps"] = 3
    assert "no_updates" not in warnings(rft, "rft") | warnings(odpo, "online_dpo")
