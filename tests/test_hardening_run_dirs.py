"""Issue 14 (hostile-user probe), run directories: resume that refuses changed options, one run per
directory, clear errors for file-system faults, a kill that cannot race the run.

One test (or a few) per class of the issue; each fails on the code before the fix."""

from __future__ import annotations

import errno
import os
import signal
import time
from pathlib import Path

import pytest

from lmpo.cli.main import main

from hardening_common import RL_RUN, SFT_RUN, error_line as _error


def _as_interrupted(run) -> None:
    """A finished run is not resumed ("nothing to resume"): its result.json removed, it reads as
    killed after its last checkpoint, which is what these tests resume."""
    (run / "result.json").unlink(missing_ok=True)



@pytest.fixture(scope="module")
def rl_run(start_model, tmp_path_factory) -> Path:
    """A finished 2-step GRPO run with a checkpoint at step 1."""
    run = tmp_path_factory.mktemp("rl") / "run"
    assert main(["train", "grpo", "--model", start_model, "--out", str(run), *RL_RUN]) == 0
    return run


@pytest.mark.parametrize("extra,names", [
    (["--lr", "0.01"], ["lr=0.01 (was 0.0001)"]),
    (["--model", "tiny", "--beta", "0.5"], ["model='tiny'", "beta=0.5 (was 0.04)"]),
], ids=["lr", "model-and-beta"])
def test_rl_resume_refuses_changed_options_listing_them(rl_run, extra, names, capsys):
    config_before = (rl_run / "config.json").read_text()
    assert main(["train", "grpo", "--resume", str(rl_run), *extra]) == 2
    line = _error(capsys)
    assert "options differ from the run's" in line and all(n in line for n in names), line
    assert f"that run finished, so to train its model further start a new run from it (--model {rl_run / 'model'})" in line
    assert (rl_run / "config.json").read_text() == config_before  # nothing rewritten


def test_rl_resume_refuses_another_preset_or_a_config_for_another_method(rl_run, tmp_path, capsys):
    assert main(["train", "dapo", "--resume", str(rl_run)]) == 2
    assert "started by `lmpo train grpo`" in _error(capsys)
    other = tmp_path / "dapo.yaml"
    other.write_text("loss: gspo\nclip_eps_low: 0.0003\nclip_eps_high: 0.0004\n")
    assert main(["train", "grpo", "--resume", str(rl_run), "--config", str(other)]) == 2
    assert "loss='gspo' (was 'ppo_clip')" in _error(capsys)
    assert main(["train", "sft", "--resume", str(rl_run)]) == 2
    assert "it is a rl run; resume it with `lmpo train grpo --resume" in _error(capsys)


def test_resuming_a_finished_run_is_refused_and_writes_nothing(rl_run, capsys):
    """Before, it redid the last steps from the kept checkpoint and rewrote model/, so a run started
    from that model could no longer be resumed ("--model ... changed since the run started")."""
    model = rl_run / "model" / "model.safetensors"
    before = (model.read_bytes(), model.stat().st_mtime_ns)
    assert main(["train", "grpo", "--resume", str(rl_run), "--threads", "2"]) == 2  # threads may change; still done
    assert _error(capsys) == (f"lmpo: error: --resume {rl_run}: that run finished (result.json), so there is "
                              f"nothing to resume; its model is {rl_run / 'model'}: to train it further, start a new "
                              f"run from it (--model {rl_run / 'model'})")
    assert (model.read_bytes(), model.stat().st_mtime_ns) == before


def _hold_in_child(run: Path) -> int:
    """A forked process that opens `run` as a run directory and waits; returns its pid."""
    ready = Path(str(run) + ".held")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            from lmpo.trainers.run_dir import open_run_dir
            from lmpo.trainers.supervised import SFTConfig

            open_run_dir(run, SFTConfig(out=str(run)), "sft")
            ready.write_text("1")
            time.sleep(120)
        finally:
            os._exit(0)
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return pid


def test_a_second_run_on_the_same_directory_is_refused_naming_the_holder(start_model, tmp_path, capsys):
    from lmpo.trainers.run_dir import RunDirError, open_run_dir
    from lmpo.trainers.supervised import SFTConfig

    run = tmp_path / "run"
    holder = _hold_in_child(run)
    try:
        assert main(["train", "sft", "--model", start_model, "--out", str(run), *SFT_RUN]) == 2
        line = _error(capsys)
        assert f"in use by process {holder}" in line and str(run) in line
        assert not (run / "metrics.jsonl").exists()
    finally:
        os.kill(holder, signal.SIGKILL)
        os.waitpid(holder, 0)
    # the holder was killed: its lock goes with it, and a resume is not blocked
    open_run_dir(run, SFTConfig(out=str(run), resume=str(run)), "sft").close()
    with pytest.raises(RunDirError, match="no such directory"):
        open_run_dir(tmp_path / "absent", SFTConfig(resume=str(tmp_path / "absent")), "sft")


def test_out_that_is_a_file_is_one_line_naming_it(start_model, tmp_path, capsys):
    f = tmp_path / "notadir"
    f.write_text("mine")
    assert main(["train", "sft", "--model", start_model, "--out", str(f), *SFT_RUN]) == 2
    assert f"--out {f}: exists and is not a directory" in _error(capsys)
    assert f.read_text() == "mine"
    assert main(["train", "sft", "--model", start_model, "--out", str(f / "sub"), *SFT_RUN]) == 2
    assert "cannot create the run directory" in _error(capsys)


@pytest.mark.parametrize("code,cause", [(errno.EROFS, "read-only file system"), (errno.EACCES, "permission denied")])
def test_a_read_only_out_is_one_line_naming_it(tmp_path, monkeypatch, code, cause):
    from lmpo.trainers import run_dir
    from lmpo.trainers.supervised import SFTConfig

    real_open = os.open

    def refuse(path, *args, **kwargs):  # what a read-only mount or directory answers (root ignores chmod)
        if str(path).startswith(str(tmp_path)):
            raise OSError(code, os.strerror(code), str(path))
        return real_open(path, *args, **kwargs)

    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setattr(run_dir.os, "open", refuse)
    with pytest.raises(run_dir.RunDirError, match=f"--out {run}: cannot write there: {cause}"):
        run_dir.open_run_dir(run, SFTConfig(out=str(run)), "sft")


class SafetensorError(Exception):
    """What safetensors raises for a full disk (its own type, not an OSError)."""


@pytest.mark.parametrize("failure", [
    RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4352 vs 4240"),
    OSError(errno.ENOSPC, "No space left on device"),
    SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
], ids=["torch-enforce", "ENOSPC", "safetensors"])
def test_a_full_disk_while_checkpointing_says_the_previous_checkpoint_is_intact(tiny_llama, char_tokenizer, tmp_path,
                                                                                 monkeypatch, failure):
    import copy

    import torch

    from lmpo.trainers import checkpoint
    from lmpo.trainers.run_dir import RunDirError
    from lmpo.trainers.runtime import make_optimizer, make_scheduler

    model = copy.deepcopy(tiny_llama)
    optimizer = make_optimizer(model, 1e-3, 0.0)
    scheduler = make_scheduler(optimizer, 1, 10)
    first = checkpoint.save_checkpoint(tmp_path, 1, model, char_tokenizer, optimizer, scheduler, {}, {})
    real_save = torch.save

    def full(obj, f, *args, **kwargs):
        if str(f).endswith("optimizer.pt"):
            raise failure
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", full)
    if isinstance(failure, SafetensorError):
        monkeypatch.setattr(type(model), "save_pretrained", lambda *a, **k: (_ for _ in ()).throw(failure))
    with pytest.raises(RunDirError) as info:
        checkpoint.save_checkpoint(tmp_path, 2, model, char_tokenizer, optimizer, scheduler, {}, {})
    line = str(info.value)
    assert "\n" not in line and "step_000002" in line and "no space left on the device" in line
    assert f"the previous checkpoint {first} is intact" in line and f"--resume {tmp_path}" in line
    assert checkpoint.latest_checkpoint(tmp_path) == first
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def test_a_full_disk_while_logging_metrics_is_one_line(tmp_path, monkeypatch):
    from lmpo.trainers.run_dir import RunDirError
    from lmpo.trainers.runtime import MetricsLog

    log = MetricsLog(tmp_path / "metrics.jsonl")

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "open", full)
    with pytest.raises(RunDirError, match=r"metrics.jsonl: no space left on the device.*--resume"):
        log.write({"step": 1})


def test_bad_options_fail_before_anything_is_written(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "grpo", "--model", "tiny", "--out", str(run), "--temperature", "0"]) == 2
    assert "temperature=0.0 must be > 0" in _error(capsys)
    assert not run.exists()
    assert main(["train", "online_dpo", "--model", "tiny", "--out", str(run), "--temperature", "-1"]) == 2
    assert not run.exists()
    assert main(["train", "grpo", "--model", "tiny", "--out", str(run), "--top_p", "0"]) == 2
    assert not run.exists()


def test_a_run_pauses_at_a_fault_point_until_killed(tmp_path):
    """What `tests/test_resume.py` kills "from outside": the run waits at the point, so a
    test never depends on how fast the run is."""
    from lmpo.trainers.faults import fault_point

    paused = tmp_path / "paused"
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.environ.update({"LMPO_PAUSE_AT": "step_end:3", "LMPO_PAUSE_FILE": str(paused)})
        fault_point("step_end", 2)
        fault_point("step_end", 3)
        os._exit(0)
    deadline = time.monotonic() + 30
    while not paused.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        assert paused.read_text() == str(pid)
        assert os.waitpid(pid, os.WNOHANG) == (0, 0)  # still there, waiting
    finally:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def test_a_run_killed_before_its_first_checkpoint_resumes_with_its_own_options(start_model, tmp_path, capsys):
    """`--resume DIR` alone, with no checkpoint yet: the options come from `run.json`, not the
    defaults, and any option that differs from them is refused (every trainer)."""
    from lmpo.trainers.run_dir import RUN_RECORD, saved_config

    run = tmp_path / "sft"
    flags = ["--model", start_model, *SFT_RUN[:-2], "--save_every", "0", "--threads", "1"]
    assert main(["train", "sft", "--out", str(run), *flags]) == 0
    assert saved_config(run)["demonstrations"] == 8 and (run / RUN_RECORD).is_file()
    _as_interrupted(run)
    assert main(["train", "sft", "--resume", str(run), "--demonstrations", "9"]) == 2
    assert "demonstrations=9 (was 8)" in _error(capsys)
    _as_interrupted(run)
    assert main(["train", "sft", "--resume", str(run)]) == 0  # no checkpoint: starts over with the run's options
    assert "no complete checkpoint" in capsys.readouterr().out


def test_a_full_disk_while_saving_the_final_model_names_it(tiny_llama, char_tokenizer, tmp_path, monkeypatch):
    from lmpo.models import save_model

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(type(tiny_llama), "save_pretrained", full)
    with pytest.raises(OSError) as info:
        save_model(tiny_llama, char_tokenizer, tmp_path / "model")
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(tmp_path / "model")
    from lmpo.cli.errors import one_line

    assert one_line(info.value) == f"cannot write {tmp_path / 'model'}: no space left on the device (the disk is full)"


def _checkpoints(run: Path) -> list[str]:
    root = run / "checkpoints"
    return sorted(p.name for p in root.iterdir() if (p / "COMPLETE").exists()) if root.is_dir() else []


def test_a_fresh_start_over_an_interrupted_run_is_refused_unless_overwrite(start_model, tmp_path, capsys):
    """The interrupted run's checkpoints are work `--resume` would continue: a start without
    `--resume` is refused, naming both ways on; `--overwrite true` deletes them first."""
    import json

    run = tmp_path / "rl"
    flags = ["--model", start_model, *RL_RUN]
    assert main(["train", "grpo", "--out", str(run), *flags, "--steps", "3"]) == 0
    (run / "result.json").unlink()  # as if killed after its last checkpoint
    assert _checkpoints(run) == ["step_000001", "step_000002"]
    metrics = (run / "metrics.jsonl").read_text()
    assert main(["train", "grpo", "--out", str(run), *flags, "--lr", "0.001"]) == 2
    line = _error(capsys)
    assert "holds an interrupted run" in line and "step_000002" in line, line
    assert f"--resume {run}" in line and "--overwrite true" in line, line
    assert _checkpoints(run) == ["step_000001", "step_000002"] and (run / "metrics.jsonl").read_text() == metrics
    assert main(["train", "grpo", "--out", str(run), *flags, "--lr", "0.001", "--overwrite", "true"]) == 0
    assert "replacing the interrupted run there (its 2 checkpoint(s) and its files deleted" in capsys.readouterr().out
    assert _checkpoints(run) == ["step_000001"]  # the new run's own: 2 steps, a checkpoint after step 1
    assert json.loads((run / "checkpoints/step_000001/state.json").read_text())["config"]["lr"] == 0.001
    _as_interrupted(run)
    assert main(["train", "grpo", "--resume", str(run)]) == 0  # its options, `overwrite` not among them


def test_a_fresh_start_over_a_finished_run_leaves_no_checkpoint_of_it_to_resume(start_model, tmp_path, capsys):
    """Before: the earlier run's newer checkpoints stayed, and `--resume` of the new run loaded
    the earlier run's step 2 (or refused it for the earlier run's options)."""
    run = tmp_path / "rl"
    flags = ["--model", start_model, *RL_RUN]
    assert main(["train", "grpo", "--out", str(run), *flags, "--steps", "3"]) == 0
    assert _checkpoints(run) == ["step_000001", "step_000002"]
    assert main(["train", "grpo", "--out", str(run), *flags, "--steps", "1", "--lr", "0.001"]) == 0
    assert "replacing the finished run there" in capsys.readouterr().out
    assert _checkpoints(run) == [] and (run / "result.json").is_file()
    _as_interrupted(run)
    assert main(["train", "grpo", "--resume", str(run), *flags, "--steps", "1", "--lr", "0.001"]) == 0
    assert "no complete checkpoint" in capsys.readouterr().out  # not the earlier run's step 2


def test_ctrl_c_says_where_the_run_can_be_continued_from(start_model, tmp_path, monkeypatch, capsys):
    import lmpo.trainers.supervised as supervised

    real = supervised.train_sft
    run = tmp_path / "sft"

    def interrupted(cfg):
        if cfg.save_every:
            real(cfg)  # its checkpoints written; then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(supervised, "train_sft", interrupted)
    assert main(["train", "sft", "--model", start_model, "--out", str(run), *SFT_RUN]) == 130
    err = capsys.readouterr().err
    assert f"{run}: its newest complete checkpoint is step_000001; continue with `lmpo train sft --resume {run}`" in err
    assert err.rstrip().endswith("lmpo: interrupted")
    other = tmp_path / "other"
    assert main(["train", "sft", "--model", start_model, "--out", str(other), *SFT_RUN, "--save_every", "0"]) == 130
    assert f"{other} has no complete checkpoint yet" in capsys.readouterr().err


def test_overwrite_with_resume_is_refused(rl_run, capsys):
    assert main(["train", "grpo", "--resume", str(rl_run), "--overwrite", "true"]) == 2
    assert "--overwrite true starts a run afresh and --resume continues one" in _error(capsys)


def test_a_stale_result_json_never_passes_an_interrupted_run_off_as_finished(start_model, tmp_path, monkeypatch,
                                                                             capsys):
    """A finished run without checkpoints, then a fresh run there stopped after its checkpoints:
    the earlier run's result.json must not let a third start delete them unasked."""
    from lmpo.trainers.harness import Run

    run = tmp_path / "rl"
    flags = ["--model", start_model, *RL_RUN]
    assert main(["train", "grpo", "--out", str(run), *flags, "--save_every", "0"]) == 0
    with monkeypatch.context() as patch:
        patch.setattr(Run, "finish", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))  # stopped at the end
        assert main(["train", "grpo", "--out", str(run), *flags, "--steps", "3"]) == 130
    assert not (run / "result.json").exists()
    assert main(["train", "grpo", "--out", str(run), *flags]) == 2
    assert "holds an interrupted run" in _error(capsys)
    assert _checkpoints(run) == ["step_000001", "step_000002"]


def test_out_that_holds_a_saved_model_is_refused_before_anything_is_written(start_model, tmp_path, capsys):
    """`--out` = `--model` overwrote the model's config.json with the run's options: the model
    could no longer be loaded. A directory holding a model (or a LoRA adapter) is not a run's."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(start_model, model)
    before = {p.name: p.read_bytes() for p in model.iterdir()}
    assert main(["train", "grpo", "--model", str(model), "--out", str(model), *RL_RUN]) == 2
    assert _error(capsys) == (f"lmpo: error: --out {model}: holds a model (config.json of a llama model, "
                              "model.safetensors), not a run; a run writes its own config.json, metrics and model/ "
                              "there, which would break that model, so choose another --out")
    assert main(["pipeline", "--out", str(model), "--threads", "1"]) == 2
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    assert main(["train", "sft", "--model", start_model, "--out", str(adapter), *SFT_RUN]) == 2
    assert "holds a model (adapter_config.json)" in _error(capsys)
