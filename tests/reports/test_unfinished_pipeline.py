"""A pipeline interrupted in its last stage: no summary.json yet, but run.json and the stage
directories. `lmpo trajectories` said "no trajectories file" (and, with --stage, "not a pipeline
directory"); `lmpo doctor` said "no problems found" with no word that the run had not finished."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from lmpo.cli.main import main
from lmpo.reports.doctor_runs import diagnose_run
from lmpo.reports.trajectories import find_trajectories

from test_trajectories import traj


@pytest.fixture
def interrupted(tmp_path: Path, rh: SimpleNamespace) -> Path:
    """cpt and sft finished; grpo was killed after its step-2 checkpoint."""
    pipe = tmp_path / "pk"
    pipe.mkdir()
    (pipe / "run.json").write_text('{"trainer": "pipeline", "command": null, "config": {}}')
    for age, (stage, trainer) in enumerate((("cpt", "cpt"), ("sft", "sft"), ("grpo", "rl"))):
        rh.write_jsonl(pipe / stage / "metrics.jsonl", rh.sft_rows() if trainer != "rl" else rh.rl_rows(4))
        record = pipe / stage / "run.json"
        record.write_text(json.dumps({"trainer": trainer, "command": None, "config": {}}))
        os.utime(record, ns=(10**18 + age, 10**18 + age))  # the order they started in: not by name
        if trainer != "rl":
            (pipe / stage / "result.json").write_text("{}")
    rh.write_jsonl(pipe / "grpo" / "trajectories.jsonl", [traj(2, index=3)])
    (pipe / "grpo" / "checkpoints" / "step_000002").mkdir(parents=True)
    (pipe / "grpo" / "checkpoints" / "step_000002" / "COMPLETE").write_text("ok\n")
    return pipe


def test_trajectories_of_an_interrupted_pipeline(interrupted: Path, capsys) -> None:
    grpo = interrupted / "grpo" / "trajectories.jsonl"
    assert find_trajectories(interrupted) == grpo and find_trajectories(interrupted, "grpo") == grpo
    with pytest.raises(ValueError, match=r"no such stage in the stage directories of .*pk.*\(stages: cpt, sft, grpo\)"):
        find_trajectories(interrupted, "nope")
    assert main(["trajectories", str(interrupted), "--last", "1"]) == 0
    assert "step 2 · train · #3" in capsys.readouterr().out
    (interrupted / "run.json").write_text('{"trainer": "rl", "command": "grpo", "config": {}}')  # no pipeline
    with pytest.raises(FileNotFoundError, match="is not a pipeline directory"):
        find_trajectories(interrupted, "grpo")


def test_the_doctor_says_a_run_has_not_finished(interrupted: Path, capsys) -> None:
    assert main(["doctor", str(interrupted)]) == 0
    out = capsys.readouterr().out
    notes = [line for line in out.splitlines() if line.startswith("note: ")]
    assert notes == [f"note: grpo: This run has not finished (no result.json): it is still running, or it was "
                     f"interrupted. Its newest complete checkpoint is step_000002; `lmpo pipeline --resume "
                     f"{interrupted}` continues an interrupted run from it."]  # was: `lmpo train rl --resume .../grpo`
    (interrupted / "run.json").rename(interrupted / "run.json.aside")  # a run of its own: its own command
    assert main(["doctor", str(interrupted / "grpo")]) == 0
    assert f"`lmpo train rl --resume {interrupted / 'grpo'}`" in capsys.readouterr().out
    (interrupted / "run.json.aside").rename(interrupted / "run.json")
    assert list(diagnose_run(interrupted)) == ["cpt", "sft", "grpo"]  # was cpt, grpo, sft: by name
    (interrupted / "grpo" / "result.json").write_text("{}")
    assert main(["doctor", str(interrupted / "grpo")]) == 0
    assert "note:" not in capsys.readouterr().out
