"""A user's function that never returns is reported with the line it was stuck on, in the
language of the check; before, `lmpo exercise check` hung until Ctrl-C."""

from pathlib import Path

import pytest

from lmpo.cli.main import main
from lmpo.teach.exercise import EXERCISES, check_file
from lmpo.teach.exercise import check as exercise_check

SOLUTIONS = Path(__file__).parent / "exercise_solutions"
CORRECT = (SOLUTIONS / "grpo_advantages_correct.py").read_text()
STUCK = "    r = rewards.detach().double()"


@pytest.fixture(autouse=True)
def short_limit(monkeypatch):
    monkeypatch.setattr(exercise_check, "CALL_SECONDS", 0.3)


def _write(tmp_path, text: str) -> Path:
    path = tmp_path / "solution.py"
    path.write_text(text)
    return path


@pytest.mark.parametrize("loop", [
    "    while rewards.numel() > 1:\n        pass\n",
    # the user's own `except Exception` does not swallow the time limit
    "    try:\n        while True:\n            pass\n    except Exception:\n        return rewards\n",
])
def test_an_endless_loop_in_the_function_is_an_error_at_its_line(tmp_path, capsys, loop):
    path = _write(tmp_path, CORRECT.replace(STUCK, loop + STUCK))
    report = check_file(path, EXERCISES["grpo_advantages"])
    assert report.error is not None, report.text()
    assert report.error.exception == "TimeLimit: did not return within 0.3 s (an endless loop?)"
    assert "solution.py:" in report.error.location and "while" in report.error.location
    assert main(["exercise", "check", str(path)]) == 1
    assert "your code raised TimeLimit: did not return within 0.3 s" in capsys.readouterr().out


def test_an_endless_loop_at_import_and_in_chinese(tmp_path, capsys):
    path = _write(tmp_path, "# lmpo exercise: grpo_advantages\nwhile True:\n    pass\n" + CORRECT)
    report = check_file(path, EXERCISES["grpo_advantages"], lang="zh")
    assert report.error is not None and report.error.exception == "TimeLimit: 0.3 秒内没有返回（死循环？）"
    assert "solution.py:2: while True:" in report.error.location


def test_a_correct_function_passes_and_the_alarm_is_left_off(tmp_path):
    import signal

    before = signal.getsignal(signal.SIGALRM)
    report = check_file(_write(tmp_path, CORRECT), EXERCISES["grpo_advantages"])
    assert report.error is None and report.mismatch is None, report.text()
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0) and signal.getsignal(signal.SIGALRM) == before
