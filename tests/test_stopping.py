"""Stopping rules: a stage runs until its held-out score stops improving (or a wall-time cap)
and ends with its best model."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from lmpo.trainers.rl import train_rl
from lmpo.trainers.rl_config import RLConfig
from lmpo.trainers.stopping import StopRule
from lmpo.trainers.supervised import CPTConfig, train_cpt


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_the_rule_counts_evaluations_without_improvement():
    rule = StopRule(patience=2, min_delta=0.01, max_seconds=0, higher_is_better=True)
    assert rule.observe(0, 0.50) and rule.reason() is None
    assert rule.observe(1, 0.60)
    assert not rule.observe(2, 0.605)  # within min_delta: no improvement
    assert rule.reason() is None
    assert not rule.observe(3, 0.40)
    assert "in 2 evaluations" in rule.reason() and rule.best_step == 1
    lower = StopRule(patience=1, min_delta=0.0, max_seconds=0, higher_is_better=False)
    assert lower.observe(0, 2.0) and lower.observe(1, 1.5) and not lower.observe(2, 1.7)
    assert lower.best == 1.5 and lower.reason()
    capped = StopRule(patience=0, min_delta=0.0, max_seconds=1e-9, higher_is_better=True)
    assert "wall-time cap" in capped.reason()


def test_cpt_stops_when_the_heldout_loss_rises_and_keeps_the_best_model(start_model, tmp_path):
    out = tmp_path / "cpt"
    # a learning rate so small that no evaluation improves on the first by min_delta
    result = train_cpt(CPTConfig(model=start_model, out=str(out), steps=60, lr=1e-7, warmup_steps=0,
                                 corpus_documents=2000, heldout_documents=200, seq_len=32, batch_size=8,
                                 eval_loss_every=5, stop_patience=2, stop_min_delta=0.05, eval_problems=0,
                                 threads=1, save_every=0))
    rows = _rows(out)
    stopped = [r for r in rows if "stopped" in r]
    assert len(stopped) == 1 and stopped[0]["step"] == 15
    best_step = 5
    assert stopped[0]["best_step"] == best_step
    assert sorted(r["step"] for r in rows if "eval_loss" in r) == [5, 10, 15]
    assert json.loads((out / "result.json").read_text())["best_step"] == best_step
    kept, final = load_file(out / "best" / "model.safetensors"), load_file(out / "model" / "model.safetensors")
    assert all((kept[k] == final[k]).all() for k in kept)  # the stage's model is the best one
    assert result.model_dir == str(out / "model")


def test_rl_stops_when_heldout_accuracy_stops_improving(start_model, tmp_path):
    out = tmp_path / "rl"
    train_rl(RLConfig(model=start_model, out=str(out), steps=10, prompts_per_step=2, group_size=4, eval_every=1,
                      eval_problems=8, stop_patience=2, threads=1, save_every=0))
    rows = _rows(out)
    stopped = [r for r in rows if "stopped" in r]
    # a random model scores 0 at step 0 and gains nothing: two evaluations later it stops
    assert stopped and stopped[0]["step"] == 2 and stopped[0]["best_step"] == 0
    assert max(r["step"] for r in rows) == 2


def test_a_stopping_rule_without_a_heldout_set_is_a_config_error():
    with pytest.raises(ValueError, match="eval_problems must be > 0"):
        RLConfig(stop_patience=3, eval_problems=0).validate()
    with pytest.raises(ValueError, match="with --data it has none"):
        CPTConfig(stop_patience=3, data="x.jsonl").validate()
