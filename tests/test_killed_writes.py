"""What writes killed part-way leave in a run directory (an atomic write's `NAME.tmp`, the
checkpoints a killed fresh start had moved aside to delete) is never read: a fresh run there
removes it with the earlier run's files, saying so in its one line, and a resume goes on as if it
were not there."""

from __future__ import annotations

import json

import torch

from lmpo.cli.main import main
from tests.test_max_minutes_resume import _same_model
from tests.test_steps_extension import _rows

DPO = ["train", "dpo", "--pairs", "12", "--batch_size", "4", "--eval_problems", "0", "--log_every", "1",
       "--save_every", "2", "--threads", "1"]


def _leave_killed_writes(run) -> list[str]:
    """What kills in the middle of atomic writes leave: each NAME.tmp holds something else than NAME."""
    (run / "metrics.jsonl.tmp").write_text(json.dumps({"step": 1, "loss": 99.0}) + "\n")
    torch.save({"batches": 3, "done": [(torch.zeros(4), torch.zeros(4))] * 3}, run / "reference_logps.pt.tmp")
    (run / "trackers.json.tmp").write_text("{")
    (run / "best.tmp").mkdir()
    (run / ".old-checkpoints-99999" / "step_000002").mkdir(parents=True)
    return [".old-checkpoints-99999", "best.tmp", "metrics.jsonl.tmp", "reference_logps.pt.tmp", "trackers.json.tmp"]


def test_a_fresh_run_removes_what_killed_writes_left_and_says_so(start_model, tmp_path, capsys):
    run = tmp_path / "dpo"
    argv = [*DPO, "--model", start_model, "--out", str(run)]
    assert main(argv) == 0
    left = _leave_killed_writes(run)
    capsys.readouterr()
    assert main(argv) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "replacing the finished run there" in line]
    assert len(said) == 1 and f"with what a killed write left: {', '.join(left)};" in said[0]
    assert not [name for name in left if (run / name).exists()]


def test_a_resume_reads_none_of_what_killed_writes_left(start_model, tmp_path, monkeypatch):
    argv = [*DPO, "--model", start_model]
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main([*argv, "--out", str(full)]) == 0
    monkeypatch.setenv("LMPO_TERM_AT", "step_end:1")
    assert main([*argv, "--out", str(cut)]) == 143
    monkeypatch.delenv("LMPO_TERM_AT")
    _leave_killed_writes(cut)
    assert main(["train", "dpo", "--resume", str(cut)]) == 0
    assert _same_model(full, cut) and _rows(cut) == _rows(full)
