"""A run directory damaged after the run: a checkpoint file truncated, emptied or deleted (said in one
line naming the file and how to resume from the checkpoint before it, instead of a traceback or
an error naming no file), the metrics log deleted (said, and the run goes on), an empty log
given to the doctor (said, instead of "no problems found"), a damaged metrics line (skipped with a
warning, and said by a resume that drops it), a run the doctor cannot read among several (an error
finding of its own, beside the others' findings). Also a negative β, which turned the
KL penalty into a reward for leaving the reference, given in scientific notation too."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from lmpo.cli.main import main
from lmpo.reports.doctor_runs import diagnose_run

from hardening_common import RL_RUN, error_line


@pytest.fixture(scope="module")
def interrupted(start_model, tmp_path_factory) -> Path:
    """A 3-step GRPO run with checkpoints after steps 1 and 2, then stopped (as if killed)."""
    run = tmp_path_factory.mktemp("damage") / "run"
    assert main(["train", "grpo", "--model", start_model, "--out", str(run), *RL_RUN, "--steps", "3"]) == 0
    shutil.rmtree(run / "model")
    (run / "result.json").unlink()
    return run


@pytest.mark.parametrize("damage,cause", [
    (lambda f: f.write_bytes(f.read_bytes()[:1000]), "model.safetensors cannot be read (Error while deserializing"),
    (lambda f: f.write_text(""), "state.json cannot be read (Expecting value"),
    (lambda f: f.unlink(), "optimizer.pt is missing"),
], ids=["truncated-weights", "empty-state", "deleted-optimizer"])
def test_a_damaged_checkpoint_is_named_with_the_way_to_resume_from_the_one_before(interrupted, tmp_path, capsys, damage,
                                                                                 cause):
    run = tmp_path / "run"
    shutil.copytree(interrupted, run)
    newest = run / "checkpoints" / "step_000002"
    damage(newest / cause.split(" ")[0])
    assert main(["train", "grpo", "--resume", str(run)]) in (1, 2)
    line = error_line(capsys)
    assert line.startswith(f"lmpo: error: --resume {run}: its newest checkpoint is damaged: {newest}/{cause}"), line
    assert line.endswith(f"move it aside (mv {newest} {newest.parent}/damaged-step_000002) to resume from "
                         f"step_000001"), line
    newest.rename(newest.parent / "damaged-step_000002")
    assert main(["train", "grpo", "--resume", str(run)]) == 0
    assert "resumed from" in capsys.readouterr().out and (run / "result.json").is_file()


def test_a_resume_without_its_metrics_log_says_what_is_lost(interrupted, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(interrupted, run)
    (run / "metrics.jsonl").unlink()
    assert main(["train", "grpo", "--resume", str(run)]) == 0
    assert f"{run / 'metrics.jsonl'} is missing: the rows of the first 2 step(s) are lost" in capsys.readouterr().out
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [3]


def test_a_resume_over_a_damaged_metrics_line_says_so_and_keeps_the_rows_around_it(tmp_path, capsys):
    """`lmpo report` and `lmpo doctor` skip a damaged line with a warning; the resume that rewrites
    the log dropped it without a word (and a non-object line stopped it with a traceback)."""
    from lmpo.trainers.runtime import MetricsLog

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "lo\n[3]\n{"step": 3}\n{"step": 4}\n{"step": 5, "lo')
    MetricsLog(path, resume_from_step=3)
    out = capsys.readouterr().out
    assert f"{path}: line 2 is damaged (not a JSON object)" in out and f"{path}: line 3 is damaged" in out
    assert "line 6" not in out  # a cut-short last line is what a kill leaves: dropped quietly, as before
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 3]


def test_a_run_that_cannot_be_read_does_not_hide_the_others(tmp_path, capsys):
    """`lmpo doctor DIR` stopped at the first run whose metrics it could not read (a line damaged in
    the middle did it too), and said nothing of the others; now a damaged line is skipped with a
    warning, a run that cannot be read at all is an error finding, the others are diagnosed, and
    the command exits 2."""
    healthy = Path(__file__).parent / "data" / "healthy_sort_pipeline" / "grpo"
    for run in ("a", "b", "c/grpo"):
        shutil.copytree(healthy, tmp_path / "out" / run)
    (tmp_path / "out" / "b" / "metrics.jsonl").unlink()
    (tmp_path / "out" / "b" / "metrics.jsonl").mkdir()  # found by the search, but read_bytes() fails
    damaged = tmp_path / "out" / "c" / "grpo" / "metrics.jsonl"
    lines = damaged.read_text().splitlines()
    damaged.write_text("\n".join([*lines[:3], lines[3][:20], *lines[4:]]) + "\n")
    with pytest.warns(RuntimeWarning, match="line 4: skipping damaged line"):
        findings = diagnose_run(tmp_path / "out")
    assert findings["a"] == [] and findings["c/grpo"] == []
    (error,) = findings["b"]
    assert error.severity == "error" and error.code == "unreadable" and "Is a directory" in error.message
    assert main(["doctor", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert "b: error: unreadable: could not be diagnosed:" in captured.out
    assert "nothing to report in: a, c/grpo" in captured.out
    assert captured.err.strip().endswith("lmpo: error: could not diagnose: b")


def test_an_empty_metrics_log_is_not_called_healthy(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text("\n\n")
    assert main(["doctor", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "note: no_rows:" in out and "holds no rows, so there is nothing to diagnose" in out
    assert "no problems found" not in out
    assert "--log_every" not in out  # no run.json: not a trainer known to have it


def test_an_empty_log_is_given_the_remedy_of_its_own_trainer(tmp_path, capsys):
    """`lmpo doctor` told an RL run with an empty log to use --log_every, which RL trainers do not have."""
    from lmpo.reports.doctor_runs import LOG_EVERY_TRAINERS, diagnose_stage
    from lmpo.trainers.run_dir import trainer_of

    listed = set()
    for command in ("cpt", "sft", "dpo", "online_dpo", "rm", "kto", "orpo", "rft", "grpo", "ppo"):
        with pytest.raises(SystemExit):
            main(["train", command, "--help"])
        if "--log_every" in capsys.readouterr().out:
            listed.add(trainer_of(command))
    assert listed == set(LOG_EVERY_TRAINERS)  # the doctor's torch-free copy of which trainers have it
    (tmp_path / "metrics.jsonl").write_text("")
    for trainer, said in (("rl", "let the run finish its first step or round"), ("sft", "--log_every N")):
        (tmp_path / "run.json").write_text(json.dumps({"trainer": trainer, "command": None, "config": {}}))
        (finding,) = diagnose_stage(tmp_path)
        assert finding.code == "no_rows" and said in finding.remedy
        assert ("--log_every" in finding.remedy) == (trainer == "sft")


@pytest.mark.parametrize("option,value", [("--beta", "-0.5"), ("--target_kl", "-0.5"), ("--beta", "-5e-1"),
                                          ("--beta", "-.5e0")])
def test_a_negative_kl_coefficient_is_refused(option, value, tmp_path, capsys):
    """`-5e-1` too: argparse took it for an option (`--beta: expected one argument`)."""
    assert main(["train", "grpo", "--out", str(tmp_path / "run"), option, value]) == 2
    assert error_line(capsys) == f"lmpo: error: invalid RL config: {option[2:]}=-0.5 must be >= 0"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("written,world,says", [
    (2, 1, "was written by 2 processes; resume it with as many (torchrun --nproc_per_node 2), not 1"),
    (1, 2, "was written by 1 process; resume it with one, not 2"),
])
def test_a_checkpoint_resumes_only_with_the_process_count_that_wrote_it(tmp_path, monkeypatch, written, world, says):
    """Before, one process resumed a 2-process checkpoint in silence: the other rank's random state
    was dropped, and the run followed neither the 2-process run nor a 1-process one."""
    import torch

    import lmpo.trainers.checkpoint as checkpoint

    (tmp_path / checkpoint.MARKER).write_text("")
    state = {"torch": torch.get_rng_state()}
    torch.save({"ranks": [state] * written} if written > 1 else state, tmp_path / "rng.pt")
    monkeypatch.setattr(checkpoint, "_world_size", lambda: world)
    with pytest.raises(ValueError, match=re.escape(says)):
        checkpoint.load_checkpoint(tmp_path, None, None, None, {})


def test_minus_infinity_is_a_value_not_an_option(tmp_path):
    """docs/rft.md's `--accept_threshold -inf` (the option's own help suggests it) was refused:
    argparse took `-inf` for an option ("expected one argument")."""
    from lmpo.cli.main import _joined_negatives, make_parser

    argv = _joined_negatives(["train", "rft", "--accept_threshold", "-inf", "--keep_top_k", "1"])
    assert make_parser("train").parse_args(argv).accept_threshold == "-inf"
    assert _joined_negatives(["--x", "-Infinity", "--y", "-.5e3", "-h"]) == ["--x=-Infinity", "--y=-.5e3", "-h"]
