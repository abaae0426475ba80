"""The DPO/KTO reference log-prob pass (before step 1) stops at a batch boundary for `--max_minutes`,
SIGTERM and Ctrl-C, with one line and no traceback, and keeps the batches it scored in
`RUN_DIR/reference_logps.pt`; `--resume` scores only the rest and ends with the weights of a run
never stopped. Each reference forward takes one second of a fake clock."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import lmpo.trainers.preference as preference
import lmpo.trainers.run_clock as run_clock
from lmpo.cli.main import main
from tests.test_max_minutes_resume import _same_model

ARGV = ["--pairs", "48", "--batch_size", "4", "--eval_problems", "0", "--log_every", "1", "--save_every", "5",
        "--threads", "1"]  # 12 batches, 12 steps


@pytest.fixture
def scored(monkeypatch):
    """The fake clock, and the batches the reference pass scored (forwards without grad)."""
    now, calls, interrupt = [1000.0], [], []
    monkeypatch.setattr(run_clock, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    real = preference.sequence_logps

    def timed(model, enc):
        if not torch.is_grad_enabled():
            if len(calls) + 1 in interrupt:
                raise KeyboardInterrupt
            now[0] += 1.0
            calls.append(1)
        return real(model, enc)

    monkeypatch.setattr(preference, "sequence_logps", timed)
    return SimpleNamespace(calls=calls, interrupt=interrupt)


def _full(start_model, tmp_path) -> object:
    full = tmp_path / "full"
    assert main(["train", "dpo", "--model", start_model, *ARGV, "--out", str(full)]) == 0
    return full


def test_the_cap_stops_the_reference_pass_and_resume_goes_on(start_model, scored, tmp_path, capsys):
    full, cut = _full(start_model, tmp_path), tmp_path / "cut"
    scored.calls.clear()
    assert main(["train", "dpo", "--model", start_model, *ARGV, "--max_minutes", str(3.5 / 60), "--out", str(cut)]) == 1
    err = capsys.readouterr().err
    assert len(scored.calls) == 4 and "Traceback" not in err and not (cut / "model").exists()
    assert err.strip().splitlines()[-1].startswith("lmpo: the wall-time cap of 0.0583333 minutes stopped the reference "
                                                  "log-prob pass at batch 4 of 12, before any training step")
    scored.calls.clear()
    assert main(["train", "dpo", "--resume", str(cut), "--max_minutes", "0"]) == 0
    assert len(scored.calls) == 8 and _same_model(full, cut)  # only the batches not yet scored
    out = capsys.readouterr().out
    assert "reference log-probs of 4 of 12 batches read from" in out
    assert "0.07 minutes trained before this resume; no wall-time cap (--max_minutes 0)" in out  # the pass's 4 s


def test_sigterm_and_ctrl_c_stop_the_reference_pass(start_model, scored, tmp_path, capsys, monkeypatch):
    full, term, intr = _full(start_model, tmp_path), tmp_path / "term", tmp_path / "intr"
    monkeypatch.setenv("LMPO_TERM_AT", "reference_batch:2")
    scored.calls.clear()
    assert main(["train", "dpo", "--model", start_model, *ARGV, "--out", str(term)]) == 143
    monkeypatch.delenv("LMPO_TERM_AT")
    assert len(scored.calls) == 2 and "lmpo: SIGTERM stopped the reference log-prob pass at batch 2 of 12" in \
        capsys.readouterr().err
    scored.interrupt.append(4)  # Ctrl-C in the fourth batch's forward
    scored.calls.clear()
    assert main(["train", "dpo", "--model", start_model, *ARGV, "--out", str(intr)]) == 130
    out = capsys.readouterr()
    assert "interrupted in the reference log-prob pass: 3 of 12 batches kept" in out.out
    assert "starts it over with its options from the reference log-probs kept there" in out.err
    scored.interrupt.clear()
    for run, done in ((term, 2), (intr, 3)):
        scored.calls.clear()
        assert main(["train", "dpo", "--resume", str(run)]) == 0
        assert len(scored.calls) == 12 - done and _same_model(full, run)


def test_a_resume_from_a_checkpoint_reads_the_pass_instead_of_repeating_it(start_model, scored, tmp_path,
                                                                             monkeypatch):
    full, cut = _full(start_model, tmp_path), tmp_path / "cut"
    monkeypatch.setenv("LMPO_TERM_AT", "step_end:6")
    assert main(["train", "dpo", "--model", start_model, *ARGV, "--out", str(cut)]) == 143
    monkeypatch.delenv("LMPO_TERM_AT")
    scored.calls.clear()
    assert main(["train", "dpo", "--resume", str(cut)]) == 0
    assert scored.calls == [] and _same_model(full, cut)


def test_a_fresh_run_over_a_finished_one_drops_its_kept_pass(start_model, scored, tmp_path):
    """Another run in the same --out must not read the earlier run's reference log-probs."""
    full = _full(start_model, tmp_path)
    assert (full / "reference_logps.pt").is_file()
    argv = [a if a != "5" else "0" for a in ARGV]  # --save_every 0: this run keeps no pass of its own
    assert main(["train", "dpo", "--model", start_model, *argv, "--out", str(full)]) == 0
    assert not (full / "reference_logps.pt").exists()


def test_a_pipeline_stopped_in_a_reference_pass_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    from lmpo.trainers.reference_pass import StoppedBeforeTraining

    def stopped(*args, **kwargs):
        raise StoppedBeforeTraining("SIGTERM stopped the reference log-prob pass at batch 2 of 12", 143)

    monkeypatch.setattr("lmpo.trainers.pipeline.run_pipeline", stopped)
    assert main(["pipeline", "--out", str(tmp_path / "p"), "--rl", "dpo"]) == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "batch 2 of 12" in err[0] and "lmpo pipeline --resume" in err[0]
