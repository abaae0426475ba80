"""`--max_minutes` counts the time a run trained before `--resume`: a run stopped by SIGTERM and
resumed stops where the uninterrupted one does, with the same model and the same `seconds`; and
a SIGTERM in the step (round) that reached the cap lets the run finish as a capped run does.

The wall clock here moves only with training: every optimizer update takes one second of a fake
clock (`lmpo.trainers.run_clock`), so the step a cap stops at does not depend on the machine."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

import lmpo.trainers.run_clock as run_clock
from lmpo.cli.main import main
from lmpo.trainers.harness import Updater
from lmpo.trainers.stopping import StopRule

CAP = str(3.5 / 60)  # minutes: the fourth update's second passes it


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(run_clock, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    real = Updater.apply

    def one_second_each(self, *args, **kwargs):
        now[0] += 1.0
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Updater, "apply", one_second_each)
    return now


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _stopped(out) -> list[dict]:
    return [r for r in _rows(out) if "stopped" in r]


def _same_model(a, b) -> bool:
    x, y = (load_file(str(d / "model" / "model.safetensors")) for d in (a, b))
    return all(torch.equal(x[k], y[k]) for k in x)


def _seconds(out) -> float:
    return json.loads((out / "result.json").read_text())["seconds"]


def _resumed_like_uninterrupted(argv: list[str], key: str, term_at: str, tmp_path, monkeypatch) -> None:
    full, cut, capped = tmp_path / "full", tmp_path / "cut", tmp_path / "capped"
    assert main([*argv, "--out", str(full)]) == 0
    stop = _stopped(full)
    assert len(stop) == 1 and "wall-time cap" in stop[0]["stopped"]
    last = stop[0][key]

    monkeypatch.setenv("LMPO_TERM_AT", term_at)  # stopped by SIGTERM early on, then resumed
    assert main([*argv, "--out", str(cut)]) == 143
    monkeypatch.delenv("LMPO_TERM_AT")
    assert main(["train", argv[1], "--resume", str(cut)]) == 0
    assert [r[key] for r in _stopped(cut)] == [last]  # where the uninterrupted run stopped, not later
    assert _same_model(full, cut) and _seconds(cut) == _seconds(full)

    # SIGTERM in the step (round) that reaches the cap: the run finishes there, exit 0, with a
    # checkpoint of that step, which `--resume --max_minutes` goes on from
    point = "after_rollout" if key == "round" else "step_end"
    monkeypatch.setenv("LMPO_TERM_AT", f"{point}:{last if key == 'round' else last - 1}")
    assert main([*argv, "--out", str(capped)]) == 0
    assert [r[key] for r in _stopped(capped)] == [last] and (capped / "result.json").exists()
    assert _same_model(full, capped)
    assert (capped / "checkpoints" / f"step_{last:06d}").exists()


def test_orpo_resumed_stops_at_the_uninterrupted_runs_step(start_model, clock, tmp_path, monkeypatch):
    argv = ["train", "orpo", "--model", start_model, "--pairs", "64", "--batch_size", "4", "--eval_problems", "0",
            "--log_every", "1", "--save_every", "100", "--max_minutes", CAP, "--threads", "1"]
    _resumed_like_uninterrupted(argv, "step", "step_end:1", tmp_path, monkeypatch)
    assert [r["step"] for r in _stopped(tmp_path / "full")] == [4]


def test_online_dpo_resumed_stops_at_the_uninterrupted_runs_round(start_model, clock, tmp_path, monkeypatch):
    argv = ["train", "online_dpo", "--model", start_model, "--rounds", "12", "--prompts_per_round", "8",
            "--samples_per_prompt", "4", "--max_new_tokens", "48", "--batch_size", "2", "--lr", "1e-3",
            "--rewards", "reward_fns:count_sevens=1.0", "--reward_timeout", "0", "--eval_problems", "0",
            "--save_every", "100", "--max_minutes", CAP, "--threads", "1"]
    _resumed_like_uninterrupted(argv, "round", "after_rollout:1", tmp_path, monkeypatch)
    assert 1 < _stopped(tmp_path / "full")[0]["round"] < 12


def test_cpt_stopping_rule_counts_the_time_before_a_resume(start_model, clock, tmp_path, monkeypatch):
    argv = ["train", "cpt", "--model", start_model, "--steps", "12", "--corpus_documents", "200", "--seq_len", "32",
            "--batch_size", "4", "--heldout_documents", "20", "--eval_loss_every", "1", "--eval_problems", "0",
            "--log_every", "1", "--save_every", "100", "--max_minutes", CAP, "--threads", "1"]
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main([*argv, "--out", str(full)]) == 0
    assert [r["step"] for r in _stopped(full)] == [4]
    monkeypatch.setenv("LMPO_TERM_AT", "step_end:1")
    assert main([*argv, "--out", str(cut)]) == 143
    monkeypatch.delenv("LMPO_TERM_AT")
    assert main(["train", "cpt", "--resume", str(cut)]) == 0
    assert [r["step"] for r in _stopped(cut)] == [4] and _same_model(full, cut)


def test_the_stopping_rules_cap_goes_on_from_its_checkpointed_time(clock):
    rule = StopRule(patience=0, min_delta=0.0, max_seconds=10.0, higher_is_better=True)
    clock[0] += 6.0
    state = json.loads(json.dumps(rule.state()))  # as a checkpoint's state.json holds it
    clock[0] += 100.0  # the time between the interruption and the resume is not trained
    resumed = StopRule(patience=0, min_delta=0.0, max_seconds=10.0, higher_is_better=True)
    resumed.load_state(state)
    clock[0] += 3.0
    assert resumed.reason() is None
    clock[0] += 1.0
    assert "wall-time cap" in resumed.reason()
