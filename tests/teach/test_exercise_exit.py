"""sys.exit() in the user's code is a failure of their code, never a silent exit 0 of lmpo."""

from pathlib import Path

import torch

from lmpo.cli.main import main
from lmpo.teach.exercise import EXERCISES, check_file

SOLUTIONS = Path(__file__).parent / "exercise_solutions"


def test_check_reports_sys_exit_as_an_error(capsys):
    path = SOLUTIONS / "grpo_advantages_exits.py"
    report = check_file(path, EXERCISES["grpo_advantages"])
    assert report.error is not None and report.error.exception == "SystemExit: 0", report.text()
    assert "grpo_advantages_exits.py:9: sys.exit(0)" in report.error.location
    assert main(["exercise", "check", str(path)]) == 1
    assert "your code raised SystemExit: 0" in capsys.readouterr().out


def test_check_reports_sys_exit_at_import(tmp_path):
    path = tmp_path / "exits_on_import.py"
    path.write_text("# lmpo exercise: grpo_advantages\nimport sys\nsys.exit(3)\n"
                    "def grpo_advantages(rewards, group_ids):\n    return rewards\n")
    report = check_file(path, EXERCISES["grpo_advantages"])
    assert report.error is not None and report.error.exception == "SystemExit: 3"


def test_train_reports_sys_exit_during_training(tmp_path, monkeypatch, capsys):
    from lmpo.teach.exercise import train

    path = tmp_path / "exits_in_training.py"
    correct = (SOLUTIONS / "grpo_advantages_correct.py").read_text()
    path.write_text(correct.replace("    r = rewards.detach().double()",
                                    "    if rewards.numel() == 64:\n        raise SystemExit(0)\n"
                                    "    r = rewards.detach().double()"))

    def training(exercise, fn, opts, lang="en"):  # what the stage does: calls it on a batch of 64
        fn(torch.rand(64), torch.arange(64) // 8)

    monkeypatch.setattr(train, "train_exercise", training)
    assert main(["exercise", "train", str(path), "--out", str(tmp_path / "runs"), "--threads", "1"]) == 1
    assert "your code raised SystemExit: 0 during training" in capsys.readouterr().out
