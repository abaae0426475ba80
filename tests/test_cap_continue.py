"""A run stopped by its wall-time cap (`--max_minutes`) goes on with `--resume RUN --max_minutes M`
(M larger, or 0): it trains the remaining steps and ends with the same weights and step rows, bit
for bit, as a run that was never capped; a killed run resumes with another cap too. The clock is
the fake one of test_max_minutes_resume: each optimizer update takes one second."""

from __future__ import annotations

import json

import pytest

from lmpo.cli.main import main
from lmpo.trainers.checkpoint import check_same_config
from tests.test_max_minutes_resume import CAP, _same_model, _stopped, clock  # noqa: F401 (a fixture)

DPO = ["train", "dpo", "--pairs", "48", "--batch_size", "4", "--eval_problems", "0", "--log_every", "1",
       "--save_every", "5", "--threads", "1"]  # 12 steps


def _step_rows(out) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r]


@pytest.mark.parametrize("trainer", ["dpo", "kto"])
def test_a_capped_run_goes_on_to_the_uncapped_runs_model(trainer, start_model, clock, tmp_path, capsys):
    argv = [*DPO[:1], trainer, "--model", start_model, *DPO[2:]]
    full, capped = tmp_path / "full", tmp_path / "capped"
    assert main([*argv, "--out", str(full)]) == 0
    assert main([*argv, "--max_minutes", CAP, "--out", str(capped)]) == 0
    assert [r["step"] for r in _stopped(capped)] == [4]
    assert json.loads((capped / "result.json").read_text())["time_cap"]["step"] == 4
    assert "--resume" in capsys.readouterr().out  # the stop says how to go on

    # the same cap again would stop at once: refused, naming the time already trained
    assert main(["train", trainer, "--resume", str(capped)]) == 2
    assert "give more than 0.07" in capsys.readouterr().err
    assert main(["train", trainer, "--resume", str(capped), "--max_minutes", "0"]) == 0
    out = capsys.readouterr().out
    assert "0.07 minutes trained before this resume; no wall-time cap" in out
    assert _same_model(full, capped)
    assert _step_rows(capped) == _step_rows(full) and not _stopped(capped)  # each step once, no stop row
    result = json.loads((capped / "result.json").read_text())
    assert "time_cap" not in result and result["seconds"] == json.loads((full / "result.json").read_text())["seconds"]


def test_a_killed_capped_run_resumes_with_a_larger_cap(start_model, clock, tmp_path, monkeypatch, capsys):
    argv = ["train", "dpo", "--model", start_model, *DPO[2:]]
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main([*argv, "--out", str(full)]) == 0
    monkeypatch.setenv("LMPO_TERM_AT", "step_end:2")
    assert main([*argv, "--max_minutes", CAP, "--out", str(cut)]) == 143
    monkeypatch.delenv("LMPO_TERM_AT")
    assert main(["train", "dpo", "--resume", str(cut), "--max_minutes", "1"]) == 0
    assert "--max_minutes 1 counts them and leaves 0.95 minutes" in capsys.readouterr().out
    assert _same_model(full, cut) and _step_rows(cut) == _step_rows(full)


def test_a_stopping_rules_cap_is_not_turned_off_on_resume():
    saved = {"stop_patience": 0, "max_minutes": 20.0, "lr": 1e-5}
    with pytest.raises(ValueError, match="stopping rule.*instead of 0"):
        check_same_config(saved, {**saved, "max_minutes": 0.0}, "")
    check_same_config(saved, {**saved, "max_minutes": 40.0}, "")  # a larger cap: allowed
    plain = {"max_minutes": 20.0, "lr": 1e-5}  # the offline trainers: a cap and no stopping rule
    check_same_config(plain, {**plain, "max_minutes": 0.0}, "")
    with pytest.raises(ValueError, match=r"rl_stage.max_minutes=0.0 \(was 20.0\)"):  # a pipeline's stage section
        check_same_config({"rl_stage": saved}, {"rl_stage": {**saved, "max_minutes": 0.0}}, "")


def test_a_capped_online_dpo_run_goes_on_to_the_uncapped_runs_model(start_model, clock, tmp_path):
    argv = ["train", "online_dpo", "--model", start_model, "--rounds", "8", "--prompts_per_round", "8",
            "--samples_per_prompt", "4", "--max_new_tokens", "48", "--batch_size", "2", "--lr", "1e-3",
            "--rewards", "reward_fns:count_sevens=1.0", "--reward_timeout", "0", "--eval_problems", "0",
            "--save_every", "3", "--threads", "1"]
    full, capped = tmp_path / "full", tmp_path / "capped"
    assert main([*argv, "--out", str(full)]) == 0
    assert main([*argv, "--max_minutes", CAP, "--out", str(capped)]) == 0
    stop = _stopped(capped)[0]["round"]
    assert 1 < stop < 8 and (capped / "checkpoints" / f"step_{stop:06d}").exists()
    assert main(["train", "online_dpo", "--resume", str(capped), "--max_minutes", "0"]) == 0
    rows = lambda out: [{k: v for k, v in r.items() if not k.startswith("time_") and not k.endswith("_s")}  # noqa: E731
                        for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]
    assert _same_model(full, capped) and rows(capped) == rows(full)


def test_a_killed_cpt_run_with_a_stopping_rules_cap_resumes_with_a_larger_one(start_model, clock, tmp_path,
                                                                               monkeypatch, capsys):
    argv = ["train", "cpt", "--model", start_model, "--steps", "12", "--corpus_documents", "200", "--seq_len", "32",
            "--batch_size", "4", "--heldout_documents", "20", "--eval_loss_every", "1", "--eval_problems", "0",
            "--log_every", "1", "--save_every", "100", "--threads", "1", "--max_minutes", CAP]
    cut = tmp_path / "cut"
    monkeypatch.setenv("LMPO_TERM_AT", "step_end:1")
    assert main([*argv, "--out", str(cut)]) == 143
    monkeypatch.delenv("LMPO_TERM_AT")
    assert main(["train", "cpt", "--resume", str(cut), "--max_minutes", "0"]) == 2  # 0 would turn the rule off
    assert "instead of 0" in capsys.readouterr().err
    assert main(["train", "cpt", "--resume", str(cut), "--max_minutes", str(6.5 / 60)]) == 0
    assert [r["step"] for r in _stopped(cut)] == [7]  # the cap of 3.5 s stopped it at step 4; this one at 7
