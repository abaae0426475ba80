"""`--report_to`: trackers receive every metrics row; a missing or unknown one is an error
before training, never a silent no-op."""

from __future__ import annotations

import json
import sys
import types

import pytest

from lmpo.trainers.supervised import SFTConfig, train_sft


def _sft(start_model, out, **kw) -> SFTConfig:
    return SFTConfig(model=start_model, out=str(out), epochs=1, demonstrations=64, eval_problems=0, log_every=1,
                     threads=1, **kw)


def test_an_unknown_or_missing_tracker_stops_before_training(start_model, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown tracker"):
        train_sft(_sft(start_model, tmp_path / "a", report_to="mlflow"))
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(ValueError, match="pip install wandb"):  # before the run directory is made
        train_sft(_sft(start_model, tmp_path / "b", report_to="wandb"))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_tracker_receives_every_metrics_row(start_model, tmp_path, monkeypatch):
    """A stand-in module with wandb's `init` / `log(dict, step=)` / `finish` interface records
    what lmpo sends it; the rows must be the metrics file's numeric fields, step by step."""
    sent: list[tuple[int, dict]] = []
    calls: list[str] = []
    fake = types.SimpleNamespace(init=lambda **kw: calls.append(f"init:{kw['project']}"),
                                 log=lambda row, step: sent.append((step, row)),
                                 finish=lambda: calls.append("finish"))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    train_sft(_sft(start_model, tmp_path / "run", report_to="wandb"))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert calls == ["init:lmpo", "finish"]
    assert [step for step, _ in sent] == [r["step"] for r in rows]
    assert [row["loss"] for _, row in sent] == pytest.approx([r["loss"] for r in rows])
