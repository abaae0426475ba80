"""A run resumed after the run whose model/ it started from (`--model RUN_A/model`) wrote that
model again (extended with --resume, or run again) is refused in one line that says so: which
run rewrote it, that the weights this run started from are gone, and how to start afresh; not
"restore that model" with a `touch` that would pass the new weights off as the old."""

from __future__ import annotations

from lmpo.cli.main import main

SFT = ["train", "sft", "--demonstrations", "16", "--batch_size", "8", "--eval_problems", "0", "--save_every", "1",
       "--lr_schedule", "constant", "--warmup_steps", "1", "--threads", "1"]
DPO = ["train", "dpo", "--pairs", "16", "--batch_size", "4", "--eval_problems", "0", "--save_every", "2",
       "--threads", "1"]


def test_a_downstream_run_whose_model_was_extended_is_told_why_it_cannot_go_on(start_model, tmp_path, monkeypatch,
                                                                              capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main([*SFT, "--model", start_model, "--epochs", "1", "--out", str(a)]) == 0
    monkeypatch.setenv("LMPO_TERM_AT", "step_end:1")
    assert main([*DPO, "--model", str(a / "model"), "--out", str(b)]) == 143
    monkeypatch.delenv("LMPO_TERM_AT")
    assert main(["train", "sft", "--resume", str(a), "--epochs", "2"]) == 0  # rewrites a/model
    capsys.readouterr()
    assert main(["train", "dpo", "--resume", str(b)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("lmpo:")]
    assert len(err) == 1 and f"--model {a / 'model'} changed since the run started (model.safetensors " in err[0]
    assert (f"it is the model of the run {a}, which wrote it again after this run started (resumed or extended, or "
            f"run again: its result.json is newer), so the weights this run started from (its reference model, a "
            f"LoRA run's base) are gone; start this run afresh from the new model with `--out {b} --overwrite "
            f"true` instead of --resume") in err[0]
    assert "touch" not in err[0] and "Restore" not in err[0]
    assert main([*DPO, "--model", str(a / "model"), "--out", str(b), "--overwrite", "true"]) == 0  # as it says
