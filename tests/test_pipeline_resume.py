"""`lmpo pipeline --resume DIR`: an interrupted pipeline goes on from where it stopped, its
finished stages kept and the interrupted one resumed from its checkpoint, and ends with the
models of an uninterrupted pipeline, bit for bit. Before, the pipeline had no --resume: the user
resumed the stage alone and ran the stages after it by hand, or started every stage over."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmpo.cli.main import main

SMALL = ["--threads", "1", "--adaptive", "false", "--cpt.steps", "6", "--cpt.save_every", "2",
         "--cpt.eval_problems", "2", "--cpt.corpus_documents", "600", "--cpt.heldout_documents", "20", "--cpt.batch_size", "8",
         "--sft.demonstrations", "32", "--sft.epochs", "2", "--sft.batch_size", "8", "--sft.save_every", "2",
         "--sft.eval_problems", "2", "--rl_stage.steps", "4", "--rl_stage.save_every", "2",
         "--rl_stage.eval_problems", "4", "--rl_stage.prompts_per_step", "2", "--rl_stage.group_size", "4"]
STAGES = ("cpt", "sft", "grpo")


def _weights(out: Path) -> dict[str, str]:
    return {stage: hashlib.md5((out / stage / "model" / "model.safetensors").read_bytes()).hexdigest()
            for stage in STAGES}


def _pipeline(out: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lmpo", "pipeline", "--out", str(out), *SMALL, *extra],
                          capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=900)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("whole") / "pl"
    done = _pipeline(out)
    assert done.returncode == 0, done.stderr
    return _weights(out)


@pytest.mark.parametrize("kill_at,stopped_in,kept", [
    ("after_rollout:3", "grpo", ["cpt", "sft"]),  # killed in RL: CPT and SFT finished
    pytest.param("checkpoint_write:4", "cpt", [], marks=pytest.mark.slow),  # writing CPT's 2nd checkpoint
])
def test_a_killed_pipeline_resumed_ends_as_an_uninterrupted_one(tmp_path, uninterrupted, kill_at, stopped_in, kept):
    out = tmp_path / "pl"
    killed = _pipeline(out, env={"LMPO_KILL_AT": kill_at})
    assert killed.returncode == -9, killed.stderr
    assert not (out / stopped_in / "result.json").exists()
    resumed = subprocess.run([sys.executable, "-m", "lmpo", "pipeline", "--resume", str(out)],
                             capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr
    said = resumed.stdout
    for stage in STAGES:
        assert (f"[pipeline] {stage}: finished earlier with these options; kept" in said) == (stage in kept), said
    assert f"resumed from {out / stopped_in}/checkpoints/step_00000" in said
    assert _weights(out) == uninterrupted
    summary = json.loads((out / "summary.json").read_text())
    assert [s["name"] for s in summary["stages"]] == list(STAGES)


def test_sigterm_names_the_pipeline_resume_and_it_continues(tmp_path, uninterrupted):
    out = tmp_path / "pl"
    stopped = _pipeline(out, env={"LMPO_TERM_AT": "after_rollout:2"})
    assert stopped.returncode == 143, stopped.stderr
    last = stopped.stderr.strip().splitlines()[-1]
    assert last.startswith(f"lmpo: stopped by SIGTERM after step 2; checkpoint {out / 'grpo'}/checkpoints/"
                           f"step_000002 written; pipeline interrupted in its grpo stage (its newest complete "
                           f"checkpoint is step_000002); continue it with `lmpo pipeline --resume {out}`"), last
    # the same options given again are the pipeline's: accepted; `threads` may change
    assert _pipeline(out, "--resume", str(out), "--threads", "2").returncode == 0
    assert _weights(out)["sft"] == uninterrupted["sft"]


def test_resume_refuses_what_it_cannot_continue(tmp_path, capsys):
    out = tmp_path / "pl"
    assert main(["pipeline", "--resume", str(out)]) != 0
    assert f"--resume {out}: no such directory" in capsys.readouterr().err
    out.mkdir()
    assert main(["pipeline", "--resume", str(out)]) != 0
    assert "holds no pipeline" in capsys.readouterr().err
    (out / "run.json").write_text(json.dumps({"trainer": "sft", "command": "sft", "config": {"lr": 1.0}}))
    assert main(["pipeline", "--resume", str(out)]) != 0
    assert f"--resume {out}: it is a sft run; resume it with `lmpo train sft --resume {out}`" in capsys.readouterr().err
    assert main(["pipeline", "--resume", str(out), "--out", str(tmp_path / "other")]) != 0
    assert "a resumed pipeline writes where it started; give --resume alone" in capsys.readouterr().err


def test_resume_with_other_options_is_refused_naming_them(tmp_path, capsys):
    out = tmp_path / "pl"
    stopped = _pipeline(out, env={"LMPO_KILL_AT": "checkpoint_write:2"})
    assert stopped.returncode == -9
    capsys.readouterr()
    assert main(["pipeline", "--resume", str(out), "--sft.lr", "0.5"]) != 0
    err = capsys.readouterr().err
    assert f"--resume {out}: options differ from the interrupted run: sft.lr=0.5 (was " in err, err
    assert not (out / "sft").exists()  # nothing was run


def test_a_finished_pipeline_is_not_resumed(tmp_path, capsys):
    out = tmp_path / "pl"
    out.mkdir()
    (out / "run.json").write_text(json.dumps({"trainer": "pipeline", "command": None, "config": {"out": str(out)}}))
    (out / "summary.json").write_text("{}")
    assert main(["pipeline", "--resume", str(out)]) != 0
    assert "that pipeline finished" in capsys.readouterr().err


def test_a_fresh_pipeline_over_an_interrupted_one_is_refused_unless_overwrite(tmp_path, capsys, no_stage_runs):
    """`lmpo pipeline --out DIR` over an interrupted pipeline deleted its finished stages and
    checkpoints without asking ('replacing the earlier run there'), where `lmpo train` refuses
    an interrupted run's checkpoints unless --overwrite true."""
    out = tmp_path / "pl"
    for stage in ("cpt", "sft"):
        (out / stage).mkdir(parents=True)
        (out / stage / "run.json").write_text(json.dumps({"trainer": stage, "command": None, "config": {}}))
    (out / "run.json").write_text(json.dumps({"trainer": "pipeline", "command": None, "config": {"out": str(out)}}))
    (out / "cpt" / "result.json").write_text("{}")
    (out / "sft" / "checkpoints" / "step_000004").mkdir(parents=True)
    (out / "sft" / "checkpoints" / "step_000004" / "COMPLETE").write_text("ok\n")
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert main(["pipeline", "--out", str(out), "--threads", "1"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"lmpo: error: --out {out}: holds an interrupted pipeline (cpt finished, sft's checkpoint step_000004); "
        f"continue it with `lmpo pipeline --resume {out}`, start afresh there with --overwrite true (deletes its "
        f"stages), or choose another --out")
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before
    assert main(["pipeline", "--resume", str(out), "--overwrite", "true"]) == 2
    assert "give one of them" in capsys.readouterr().err
    with pytest.raises(AssertionError, match="CPT ran"):  # past the refusal, to its first stage
        main(["pipeline", "--out", str(out), "--threads", "1", "--overwrite", "true"])
    (out / "summary.json").write_text("{}")  # a finished pipeline is replaced, as a finished run is
    with pytest.raises(AssertionError, match="CPT ran"):
        main(["pipeline", "--out", str(out), "--threads", "1"])


def test_a_finished_stage_given_another_cap_or_more_steps_is_not_kept(tmp_path):
    """A resume may change --max_minutes and grow --steps to go on with a run, but a pipeline stage
    that finished is kept only when its cap and steps are those given: a larger budget trains it again."""
    import dataclasses
    import json
    from dataclasses import replace

    from lmpo.trainers.pipeline_resume import finished_stage
    from lmpo.trainers.supervised import CPTConfig

    stage = CPTConfig(out=str(tmp_path / "cpt"), steps=100, max_minutes=20.0, stop_patience=3, lr_schedule="constant")
    (tmp_path / "cpt" / "model").mkdir(parents=True)
    (tmp_path / "cpt" / "result.json").write_text(json.dumps({"name": "cpt", "seconds": 1.0, "model_dir": "m",
                                                             "run_dir": "r", "config": dataclasses.asdict(stage)}))
    assert finished_stage(stage) is not None
    assert finished_stage(replace(stage, max_minutes=40.0)) is None
    assert finished_stage(replace(stage, steps=200)) is None
    assert finished_stage(replace(stage, threads=3)) is not None  # what changes no result keeps it
