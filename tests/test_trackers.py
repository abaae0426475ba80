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
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert json.loads((out / "trackers.json").read_text()) == {"wandb": first["id"],
                                                                "last_step": {"wandb": rows[-1]["step"]}}
    # W&B drops a step it holds ("Step must only increase"): step 3, sent before the interruption,
    # is not sent again; every step reaches it once, in order
    assert [s for p, s in sent if p == 1] == [1, 2, 3] and [s for p, s in sent if p == 2][0] == 4
    assert [s for _, s in sent] == [r["step"] for r in rows]
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


def _fake(name: str, inits: list, sent: list):
    return types.SimpleNamespace(init=lambda **kw: inits.append(kw), finish=lambda: None,
                                 log=lambda row, step: sent.append((name, step)))


def test_a_resume_sends_wandb_and_trackio_only_the_steps_they_lack(tmp_path, monkeypatch):
    """The interrupted process sent steps 1-5 (its checkpoint at 3); the resumed one writes 4, 5, 6
    again: W&B and trackio get only 6, TensorBoard (which replaces) all of them."""
    from lmpo.trainers.trackers import Trackers

    inits, sent = [], []
    for name in ("wandb", "trackio"):
        monkeypatch.setitem(sys.modules, name, _fake(name, inits, sent))
    first = Trackers.start("wandb,trackio", tmp_path, "sft", {})
    for step in range(1, 6):
        first.write({"step": step, "loss": 1.0})
    assert [s for n, s in sent if n == "wandb"] == [1, 2, 3, 4, 5]
    sent.clear()
    resumed = Trackers.start("wandb,trackio", tmp_path, "sft", {}, resume=True)
    resumed.resumed_from(3)
    for step in (4, 4, 5, 6, 6):  # a step's second row (its evaluation, say) goes with it
        resumed.write({"step": step, "loss": 2.0})
    assert sent == [("wandb", 6), ("trackio", 6), ("wandb", 6), ("trackio", 6)]
    assert json.loads((tmp_path / "trackers.json").read_text())["last_step"] == {"wandb": 6, "trackio": 6}


def test_a_tracker_new_at_the_resume_or_a_fresh_run_gets_every_step(tmp_path, monkeypatch):
    from lmpo.trainers.trackers import Trackers

    inits, sent = [], []
    for name in ("wandb", "trackio"):
        monkeypatch.setitem(sys.modules, name, _fake(name, inits, sent))
    first = Trackers.start("trackio", tmp_path, "sft", {})
    for step in range(1, 4):
        first.write({"step": step})
    sent.clear()
    resumed = Trackers.start("trackio,wandb", tmp_path, "sft", {}, resume=True)  # W&B asked for only now
    for step in (2, 3, 4):
        resumed.write({"step": step})
    assert sent == [("wandb", 2), ("wandb", 3), ("trackio", 4), ("wandb", 4)]
    sent.clear()
    fresh = Trackers.start("trackio,wandb", tmp_path, "sft", {})  # --overwrite: new tracker runs
    fresh.write({"step": 1})
    assert sent == [("trackio", 1), ("wandb", 1)]
