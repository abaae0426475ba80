"""`--resume RUN --steps N` with more steps than the run planned: allowed where nothing the steps
so far computed depends on the total (a constant learning-rate schedule), and then the run ends
with the weights and step rows of a run planned that long from the start, bit for bit, whether it
was interrupted or had finished; refused in one line where the schedule decays over the steps."""

from __future__ import annotations

import json

from lmpo.cli.main import main
from tests.test_max_minutes_resume import _same_model

CPT = ["train", "cpt", "--log_every", "1", "--corpus_documents", "40", "--seq_len", "15", "--batch_size", "8",
       "--warmup_steps", "1", "--eval_problems", "0", "--save_every", "2", "--threads", "1"]
GRPO = ["train", "grpo", "--prompts_per_step", "2", "--group_size", "4", "--prompt_pool", "5", "--max_new_tokens", "12",
        "--eval_problems", "0", "--save_every", "2", "--lr", "1e-3", "--rewards", "reward_fns:count_sevens=1.0",
        "--reward_timeout", "0", "--threads", "1"]


def _rows(out) -> list[dict]:
    """The step rows, without their timings (seconds, throughput, memory: the machine's, not the run's)."""
    rows = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    return [{k: v for k, v in r.items() if not (k.endswith(("_s", "_mb")) or "per_s" in k or k.startswith("time_"))} for r in rows]


def test_a_constant_schedule_run_interrupted_is_extended_like_a_longer_run(start_model, tmp_path, monkeypatch):
    argv = [*CPT, "--model", start_model, "--lr_schedule", "constant"]
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main([*argv, "--steps", "8", "--out", str(full)]) == 0
    monkeypatch.setenv("LMPO_TERM_AT", "step_end:3")
    assert main([*argv, "--steps", "6", "--out", str(cut)]) == 143
    monkeypatch.delenv("LMPO_TERM_AT")
    assert main(["train", "cpt", "--resume", str(cut), "--steps", "8"]) == 0
    assert _same_model(full, cut) and _rows(cut) == _rows(full)


def test_a_finished_rl_run_is_extended_from_its_newest_checkpoint(start_model, tmp_path, capsys):
    argv = [*GRPO, "--model", start_model]  # RL's schedule is constant by default
    full, done = tmp_path / "full", tmp_path / "done"
    assert main([*argv, "--steps", "7", "--out", str(full)]) == 0
    assert main([*argv, "--steps", "5", "--out", str(done)]) == 0
    capsys.readouterr()
    assert main(["train", "grpo", "--resume", str(done), "--steps", "7"]) == 0
    assert "finished; going on to the longer --steps from its newest checkpoint, step_000004" in capsys.readouterr().out
    assert _same_model(full, done)
    assert [r["step"] for r in _rows(done)] == list(range(1, 8)) and _rows(done) == _rows(full)  # step 5 once
    assert json.loads((done / "result.json").read_text())["config"]["steps"] == 7


def test_a_decaying_schedule_refuses_more_steps_saying_why(start_model, tmp_path, capsys):
    run = tmp_path / "cpt"
    assert main([*CPT, "--model", start_model, "--steps", "4", "--out", str(run)]) == 0  # cosine, the default
    assert main(["train", "cpt", "--resume", str(run), "--steps", "8"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("lmpo:")]
    assert len(err) == 1 and "steps=8 (was 4): the cosine learning-rate schedule decays over the run's --steps" in err[0]
    assert f"that run finished, so to train further start a new run from its model (--model {run / 'model'})" in err[0]


def test_a_finished_extended_run_resumed_again_is_refused_not_retrained(start_model, tmp_path, capsys):
    """Its run.json keeps the first --steps; the steps it finished with are result.json's: a plain
    `--resume` (the options of its newest checkpoint, steps 8) is not a longer run than 8."""
    run = tmp_path / "cpt"
    argv = [*CPT, "--model", start_model, "--lr_schedule", "constant"]
    assert main([*argv, "--steps", "4", "--out", str(run)]) == 0
    assert main(["train", "cpt", "--resume", str(run), "--steps", "8"]) == 0
    written = (run / "model" / "model.safetensors").stat().st_mtime_ns
    capsys.readouterr()
    assert main(["train", "cpt", "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert "that run finished (result.json), so there is nothing to resume" in err and "going on" not in err
    assert (run / "model" / "model.safetensors").stat().st_mtime_ns == written
    assert main(["train", "cpt", "--resume", str(run), "--steps", "10"]) == 0  # longer than 8: goes on


def test_a_run_its_stopping_rule_ended_is_not_extended(start_model, tmp_path, capsys):
    """Ended early by stop_patience, a longer --steps would retrain to the same stop: refused."""
    run = tmp_path / "cpt"
    argv = ["train", "cpt", "--model", start_model, "--log_every", "1", "--corpus_documents", "200", "--seq_len", "32",
            "--batch_size", "4", "--heldout_documents", "20", "--eval_loss_every", "1", "--eval_problems", "0",
            "--save_every", "2", "--threads", "1", "--lr_schedule", "constant", "--stop_patience", "3",
            "--stop_min_delta", "5", "--steps", "30"]
    assert main([*argv, "--out", str(run)]) == 0
    stop = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "stopped" in r][0]["step"]
    assert stop < 30 and list((run / "checkpoints").glob("step_*"))
    written = (run / "model" / "model.safetensors").stat().st_mtime_ns
    capsys.readouterr()
    assert main(["train", "cpt", "--resume", str(run), "--steps", "40"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("lmpo:")]
    assert len(err) == 1 and f"that run was ended at step {stop} by its stopping rule (no improvement" in err[0]
    assert (run / "result.json").is_file() and (run / "model" / "model.safetensors").stat().st_mtime_ns == written


def test_a_finished_run_without_checkpoints_says_why_its_steps_cannot_grow(start_model, tmp_path, capsys):
    run = tmp_path / "cpt"
    argv = [*CPT, "--model", start_model, "--lr_schedule", "constant", "--save_every", "0"]
    assert main([*argv, "--steps", "4", "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["train", "cpt", "--resume", str(run), "--steps", "8"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("lmpo:")]
    assert len(err) == 1 and (f"that run finished (result.json) and kept no checkpoint in {run / 'checkpoints'} to go "
                              f"on to --steps 8 from (--save_every 0, or deleted)") in err[0]
