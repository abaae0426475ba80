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


class _Interrupted(Exception):
    pass


def test_a_resumed_run_continues_its_tracker_run(start_model, tmp_path, monkeypatch):
    """`--resume` continues the W&B run it interrupted (its id kept in the run directory,
    `resume="allow"`) rather than opening a second one; TensorBoard's writer purges what the
    interrupted process logged after its checkpoint."""
    inits: list[dict] = []
    sent: list[tuple[int, int]] = []  # (process, step)
    wandb = types.SimpleNamespace(init=lambda **kw: inits.append({k: v for k, v in kw.items() if k != "config"}),
                                  log=lambda row, step: sent.append((len(inits), step)), finish=lambda: None)
    writers: list[dict] = []

    class SummaryWriter:
        def __init__(self, log_dir, purge_step=None):
            writers.append({"log_dir": log_dir, "purge_step": purge_step, "steps": []})

        def add_scalar(self, key, value, step):
            if key == "loss":
                writers[-1]["steps"].append(step)

        def flush(self):
            pass

        def close(self):
            pass

    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.setitem(sys.modules, "tensorboard", types.ModuleType("tensorboard"))
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=SummaryWriter))
    import lmpo.trainers.supervised as supervised

    def kill_after_step_3(name, step):  # as if killed after step 3, its checkpoint at step 2
        if (name, step) == ("step_end", 3):
            raise _Interrupted

    monkeypatch.setattr(supervised, "fault_point", kill_after_step_3)
    out = tmp_path / "run"
    cfg = _sft(start_model, out, report_to="wandb,tensorboard", save_every=2, batch_size=8)
    with pytest.raises(_Interrupted):
        train_sft(cfg)
    import gc
    gc.collect()  # the interrupted run's lock on its directory goes with it
    monkeypatch.setattr(supervised, "fault_point", lambda name, step: None)
    import dataclasses
    train_sft(dataclasses.replace(cfg, resume=str(out)))
    first, second = inits
    assert first["id"] and second["id"] == first["id"] and second.get("resume") == "allow"
    assert "resume" not in first
    assert json.loads((out / "trackers.json").read_text()) == {"wandb": first["id"]}
    assert [s for p, s in sent if p == 1] == [1, 2, 3] and [s for p, s in sent if p == 2][0] == 3
    assert [w["purge_step"] for w in writers] == [None, 3]  # step 3 again: the first copy hidden
    assert writers[1]["steps"][0] == 3


def test_a_fresh_run_in_a_directory_gets_a_new_tracker_run(tmp_path, monkeypatch):
    from lmpo.trainers.trackers import Trackers

    inits: list[dict] = []
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=lambda **kw: inits.append(kw),
                                                                    log=None, finish=None))
    monkeypatch.setitem(sys.modules, "trackio", types.SimpleNamespace(init=lambda **kw: inits.append(kw),
                                                                     log=None, finish=None))
    Trackers.start("wandb,trackio", tmp_path, "sft", {})
    Trackers.start("wandb,trackio", tmp_path, "sft", {}, resume=True)
    Trackers.start("wandb", tmp_path, "sft", {})  # --overwrite or a new run there: not the old tracker run
    assert inits[0]["id"] == inits[2]["id"] != inits[4]["id"]
    assert inits[3] == {"project": "lmpo", "name": f"{tmp_path.name}-sft", "config": {}, "resume": "allow"}
    assert "resume" not in inits[1] and "id" not in inits[1]  # trackio resumes by the run's name
