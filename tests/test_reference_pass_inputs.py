"""The reference log-probs a stopped pass kept in `RUN/reference_logps.pt` are read by `--resume`
only for the inputs they were scored on: a data file edited since (same number of pairs), or a
`--model` rewritten since (its upstream run extended), and the pass is computed again; a damaged
or foreign file costs a recomputation, not the run."""

from __future__ import annotations

import json

import torch

from lmpo.cli.main import main
from tests.test_max_minutes_resume import _same_model
from tests.test_reference_pass_stop import ARGV as TASK_ARGV
from tests.test_reference_pass_stop import scored  # noqa: F401 - the fixture

ARGV = ["--batch_size", "4", "--eval_problems", "0", "--log_every", "1", "--save_every", "5", "--threads", "1",
        "--max_length", "64"]


def _pairs(path, tag: str) -> str:
    path.write_text("".join(json.dumps({"prompt": f"{i}{tag}=", "chosen": f"{i % 7}", "rejected": f"{(i + 3) % 7}"})
                            + "\n" for i in range(16)))
    return str(path)


def test_a_kept_pass_is_not_read_for_edited_data(start_model, scored, tmp_path, monkeypatch, capsys):  # noqa: F811
    data, cut, fresh = tmp_path / "pairs.jsonl", tmp_path / "cut", tmp_path / "fresh"
    _pairs(data, "a")
    monkeypatch.setenv("LMPO_TERM_AT", "reference_batch:2")
    assert main(["train", "dpo", "--model", start_model, *ARGV, "--data", str(data), "--out", str(cut)]) == 143
    monkeypatch.delenv("LMPO_TERM_AT")
    _pairs(data, "b")  # the same 16 pairs' count, other text
    assert main(["train", "dpo", "--model", start_model, *ARGV, "--data", str(data), "--out", str(fresh)]) == 0
    capsys.readouterr()
    scored.calls.clear()
    assert main(["train", "dpo", "--resume", str(cut)]) == 0
    assert len(scored.calls) == 4 and _same_model(fresh, cut)  # scored again, on the data as it is now
    assert "were scored on other inputs (--data changed); computing them again" in capsys.readouterr().out


def test_a_damaged_or_foreign_pass_file_is_computed_again(start_model, scored, tmp_path, monkeypatch, capsys):  # noqa: F811
    data, cut = tmp_path / "pairs.jsonl", tmp_path / "cut"
    _pairs(data, "a")
    for content in (b"\x80\x02garbage", None):
        monkeypatch.setenv("LMPO_TERM_AT", "reference_batch:2")
        assert main(["train", "dpo", "--model", start_model, *ARGV, "--data", str(data), "--out", str(cut),
                     "--overwrite", "true"]) == 143
        monkeypatch.delenv("LMPO_TERM_AT")
        if content is None:
            torch.save([1, 2, 3], cut / "reference_logps.pt")  # a torch file, not a pass
        else:
            (cut / "reference_logps.pt").write_bytes(content)
        capsys.readouterr()
        scored.calls.clear()
        assert main(["train", "dpo", "--resume", str(cut)]) == 0
        assert len(scored.calls) == 4 and "Traceback" not in capsys.readouterr().err


def test_a_resume_with_no_time_left_says_the_pass_stops_at_once(start_model, scored, tmp_path, monkeypatch,  # noqa: F811
                                                                 capsys):
    cut = tmp_path / "cut"
    monkeypatch.setenv("LMPO_TERM_AT", "reference_batch:2")
    assert main(["train", "dpo", "--model", start_model, *TASK_ARGV, "--out", str(cut)]) == 143
    monkeypatch.delenv("LMPO_TERM_AT")
    capsys.readouterr()
    assert main(["train", "dpo", "--resume", str(cut), "--max_minutes", str(1 / 60)]) == 1
    assert ("0.03 minutes trained before this resume; --max_minutes 0.0166667 counts them, so no time is left: the "
            "reference pass stops before its next batch") in capsys.readouterr().out
