"""Options given in a `--config` YAML file act as the same flags do: `task:` brings the task's
suggested settings (to `lmpo train` and `lmpo eval`), and `resume:`, `out:` and `overwrite:` meet
the same checks. Before, `task: vault` in a file trained SFT for 30 steps instead of vault's 188,
and `resume:` with `overwrite: true` or another `out:` was taken in silence."""

from __future__ import annotations

import pytest

import lmpo.cli.train as train_cli
from lmpo.cli.main import main


class Captured(Exception):
    pass


@pytest.fixture
def captured(monkeypatch):
    seen = {}
    real = train_cli._trainer

    def trainer(kind, flags):
        cls, _, preset = real(kind, flags)

        def capture(cfg):
            seen["cfg"] = cfg
            raise Captured

        return cls, capture, preset

    monkeypatch.setattr(train_cli, "_trainer", trainer)
    return seen


def _yaml(tmp_path, text: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("stage", ["sft", "grpo"])
def test_a_task_in_the_file_brings_its_suggested_settings(tmp_path, captured, stage):
    with pytest.raises(Captured):
        main(["train", stage, "--task", "vault", "--out", str(tmp_path / "a")])
    by_flag = captured.pop("cfg")
    with pytest.raises(Captured):
        main(["train", stage, "--config", _yaml(tmp_path, f"task: vault\nout: {tmp_path / 'b'}\n")])
    by_file = captured.pop("cfg")
    assert by_file.max_new_tokens == by_flag.max_new_tokens == 48 if stage == "grpo" else True
    assert {k: v for k, v in vars(by_file).items() if k not in ("out", "task")} == \
        {k: v for k, v in vars(by_flag).items() if k not in ("out", "task")}


def test_eval_takes_the_task_of_its_file(tmp_path, monkeypatch):
    import lmpo.trainers.eval_model as eval_model

    seen = {}

    def capture(cfg):
        seen["cfg"] = cfg
        raise Captured

    monkeypatch.setattr(eval_model, "eval_model", capture)
    with pytest.raises(Captured):
        main(["eval", "--config", _yaml(tmp_path, "task: vault\n")])
    assert seen["cfg"].max_new_tokens == 48


def _interrupted(tmp_path):
    """A directory an interrupted SFT run left."""
    import json

    run = tmp_path / "run"
    step = run / "checkpoints" / "step_000002"
    step.mkdir(parents=True)
    (step / "COMPLETE").write_text("ok\n")
    (run / "run.json").write_text(json.dumps({"trainer": "sft", "command": "sft", "config": {}}))
    return run


@pytest.mark.parametrize("text,message", [
    ("resume: {run}\noverwrite: true\n", "--overwrite true starts a run afresh and --resume continues one"),
    ("resume: {run}\nout: {other}\n", "names another: a resumed run writes where it started"),
])
def test_resume_in_the_file_meets_the_checks_of_the_flag(tmp_path, captured, capsys, text, message):
    run = _interrupted(tmp_path)
    config = _yaml(tmp_path, text.format(run=run, other=tmp_path / "other"))
    assert main(["train", "sft", "--config", config]) == 2
    assert message in capsys.readouterr().err and "cfg" not in captured
    assert main(["train", "sft", "--resume", str(run), "--config", _yaml(tmp_path, f"out: {tmp_path / 'x'}\n")]) == 2
    assert "names another" in capsys.readouterr().err


def test_resume_with_a_file_takes_the_run_s_options_under_what_the_file_sets(tmp_path, captured):
    """`--resume RUN --config FILE` took every option the file left out from the defaults, not
    from the run, so the very file that started a run (`--config run.yaml --seed 5`) could not
    resume it: refused over `seed=0 (was 5)` (QA U). Flags already worked so."""
    import dataclasses
    import json

    from lmpo.trainers.rl_config import RLConfig

    run = tmp_path / "run"
    run.mkdir()
    started = RLConfig(model="tiny", out=str(run), seed=5, steps=4, group_size=2, lr=3e-4, eval_problems=0)
    (run / "config.json").write_text(json.dumps(dataclasses.asdict(started)))
    (run / "run.json").write_text(json.dumps({"trainer": "rl", "command": "grpo"}))
    with pytest.raises(Captured):
        main(["train", "grpo", "--resume", str(run), "--config", _yaml(tmp_path, "steps: 4\nmodel: tiny\n")])
    resumed = dataclasses.asdict(captured.pop("cfg"))
    assert {k: v for k, v in resumed.items() if k != "resume"} == \
        {k: v for k, v in dataclasses.asdict(started).items() if k != "resume"}
    with pytest.raises(Captured):  # what the file sets stands, for the run to compare with its own
        main(["train", "grpo", "--resume", str(run), "--config", _yaml(tmp_path, "seed: 6\n")])
    assert captured.pop("cfg").seed == 6


def test_a_task_with_data_does_not_bring_evaluation_settings_that_would_be_refused(tmp_path, captured, capsys):
    """`lmpo train dpo --data pairs.jsonl --task calculator` was refused over
    `eval_max_new_tokens=48`, an option the user never gave: the task suggests it, and with --data
    there is no held-out evaluation for it to shape (QA T)."""
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"prompt": "1+1=", "chosen": "2", "rejected": "3"}\n')
    with pytest.raises(Captured):
        main(["train", "dpo", "--data", str(pairs), "--task", "calculator", "--out", str(tmp_path / "a")])
    from lmpo.trainers.validation import no_heldout_problems

    cfg = captured.pop("cfg")
    assert cfg.eval_max_new_tokens == 12 and no_heldout_problems(cfg) == []  # the default, not the task's 48
    with pytest.raises(Captured):
        main(["train", "dpo", "--data", str(pairs), "--task", "calculator", "--eval_max_new_tokens", "48",
              "--out", str(tmp_path / "b")])
    (problem,) = no_heldout_problems(captured.pop("cfg"))  # given by the user, it is still refused
    assert problem.startswith("eval_max_new_tokens=48 shapes the held-out evaluation")
