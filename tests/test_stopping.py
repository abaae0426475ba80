"""Stopping rules: a stage runs until its held-out score stops improving (or a wall-time cap)
and ends with its best model."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from safetensors.torch import load_file

from lmpo.envs import make_task
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
    assert rule.observe(2, 0.605)  # the best model so far, but within min_delta: patience runs on
    assert rule.waited == 1 and rule.reason() is None
    assert not rule.observe(3, 0.40)
    assert "in 2 evaluations" in rule.reason() and rule.best_step == 2
    creep = StopRule(patience=3, min_delta=0.01, max_seconds=0, higher_is_better=True)
    assert all(creep.observe(i, 0.5 + 0.003 * i) for i in range(4))  # each a little better: kept
    assert creep.best_step == 3 and "in 3 evaluations" in creep.reason()  # but too slowly to go on
    lower = StopRule(patience=1, min_delta=0.0, max_seconds=0, higher_is_better=False)
    assert lower.observe(0, 2.0) and lower.observe(1, 1.5) and not lower.observe(2, 1.7)
    assert lower.best == 1.5 and lower.reason()
    capped = StopRule(patience=0, min_delta=0.0, max_seconds=1e-9, higher_is_better=True)
    assert "wall-time cap" in capped.reason()


def test_cpt_stops_when_the_heldout_loss_rises_and_keeps_the_best_model(start_model, tmp_path):
    out = tmp_path / "cpt"
    # a learning rate too high to settle: the held-out loss falls at step 10, then rises
    result = train_cpt(CPTConfig(model=start_model, out=str(out), steps=60, lr=0.03, warmup_steps=0,
                                 lr_schedule="constant", corpus_documents=2000, heldout_documents=200, seq_len=32,
                                 batch_size=8, eval_loss_every=5, stop_patience=2, stop_min_delta=0.05,
                                 eval_problems=0, threads=1, save_every=0))
    rows = _rows(out)
    stopped = [r for r in rows if "stopped" in r]
    assert len(stopped) == 1 and stopped[0]["step"] == 20
    best_step = 10
    assert stopped[0]["best_step"] == best_step
    losses = {r["step"]: r["eval_loss"] for r in rows if "eval_loss" in r}
    assert sorted(losses) == [5, 10, 15, 20] and min(losses, key=losses.get) == best_step
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


def test_rl_picks_the_best_model_on_problems_it_does_not_report(start_model, tmp_path, monkeypatch):
    """The rule selects on held-out problems after the reported ones, so the reported accuracy is
    not the best of several evaluations of the same set."""
    import lmpo.trainers.rl as rl
    from lmpo.envs import make_task

    seen: list[list[str]] = []
    real = rl.evaluate

    def recording(model, tokenizer, task, problems, **options):
        seen.append([p.prompt for p in problems])
        return real(model, tokenizer, task, problems, **options)

    monkeypatch.setattr(rl, "evaluate", recording)
    out = tmp_path / "rl"
    train_rl(RLConfig(model=start_model, out=str(out), steps=2, prompts_per_step=2, group_size=4, eval_every=1,
                      eval_problems=8, select_problems=4, stop_patience=5, threads=1, save_every=0))
    reported = [p.prompt for p in make_task("sort_digits").heldout_problems(8)]
    assert seen[0] == reported and len(seen[1]) == 4 and not set(seen[1]) & set(reported)
    assert all(names in (reported, seen[1]) for names in seen)
    evals = [r for r in _rows(out) if "eval_accuracy" in r]
    assert len(evals) == 3 and all("eval_select_accuracy" in r for r in evals)
    seen.clear()
    train_rl(RLConfig(model=start_model, out=str(tmp_path / "plain"), steps=1, prompts_per_step=2, group_size=4,
                      eval_problems=8, select_problems=4, threads=1, save_every=0))
    assert seen and all(names == reported for names in seen)  # no rule, no selection set


def test_a_prompt_file_too_short_to_select_on_is_an_error(start_model, tmp_path):
    rows = tmp_path / "eval.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{i}{i}{i}{i}{i}{i}="}) + "\n" for i in range(4)))
    with pytest.raises(ValueError, match="select_problems=0"):
        train_rl(RLConfig(model=start_model, out=str(tmp_path / "rl"), steps=1, prompts_per_step=2, group_size=4,
                          eval_prompts=str(rows), eval_problems=8, stop_patience=2, threads=1, save_every=0))


def test_a_held_out_split_too_small_for_the_selection_problems_says_which_options_to_lower():
    from lmpo.trainers.rl import heldout_and_selection

    cfg = RLConfig(task="sort_digits:length=3", eval_problems=60, select_problems=200, stop_patience=2)
    with pytest.raises(ValueError, match="select_problems=200 for the stopping rule"):
        heldout_and_selection(cfg, make_task(cfg.task), None, stopping=True)
    reported, selection = heldout_and_selection(replace(cfg, select_problems=20), make_task(cfg.task), None,
                                                stopping=True)
    assert len(reported) == 60 and len(selection) == 20


def test_cpt_held_out_documents_too_few_for_one_row_are_refused_before_the_run(tmp_path):
    """They made no row, and the held-out loss read 0.0: a perfect loss for the stopping rule."""
    cfg = CPTConfig(out=str(tmp_path / "cpt"), steps=2, eval_problems=10, heldout_documents=10, stop_patience=3,
                    threads=1)
    with pytest.raises(ValueError, match=r"heldout_documents=10: the held-out documents hold \d+ tokens, less than "
                                         r"one row of seq_len \+ 1 = 129; give more of them"):
        train_cpt(cfg)
    assert not (tmp_path / "cpt").exists()
