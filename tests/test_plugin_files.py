"""Plugin files (`--task path/to/file.py:Class`, `--rewards path/to/file.py:fn=1`): what they can
import, and the errors that name a missing or wrong reward function."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from lmpo.envs import make_task
from lmpo.rollout.reward_runner import RewardRunner

TASK_FILE = """from lmpo_test_beside_task import LENGTH
from lmpo_test_in_cwd import SHARE
import sys; sys.path.insert(0, {data!r})
from user_task import Reverse


def make():
    return Reverse(length=LENGTH, heldout_share=SHARE)
"""
REWARD_FILE = """from lmpo_test_beside_reward import BONUS


def bonus(task, problems, completions, terminated):
    return [BONUS for _ in completions]
"""
HELPERS = ("lmpo_test_beside_task", "lmpo_test_in_cwd", "lmpo_test_beside_reward")


@pytest.fixture
def installed_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A current directory that is not on sys.path, as under the installed `lmpo` script (whose
    sys.path starts with the script's directory), and plugin files in another directory."""
    cwd, elsewhere = tmp_path / "cwd", tmp_path / "plugins"
    cwd.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(cwd))])
    monkeypatch.setenv("LMPO_TASK_FILES", "")  # set (not deleted) so that the files loaded here are forgotten after
    yield elsewhere
    for name in HELPERS:
        sys.modules.pop(name, None)


def test_a_task_file_imports_helpers_beside_it_and_in_the_current_directory(installed_script: Path):
    """It failed with `No module named 'user_task'` under the installed script, not under `python -m lmpo`."""
    data = Path(__file__).parent / "data"
    (installed_script / "task.py").write_text(TASK_FILE.format(data=str(data)))
    (installed_script / "lmpo_test_beside_task.py").write_text("LENGTH = 3\n")
    Path("lmpo_test_in_cwd.py").write_text("SHARE = 0.25\n")
    task = make_task(f"{installed_script}/task.py:make")
    assert (task.length, task.heldout_share) == (3, 0.25)


def test_a_reward_file_imports_a_helper_beside_it_in_its_worker(installed_script: Path):
    (installed_script / "rw.py").write_text(REWARD_FILE)
    (installed_script / "lmpo_test_beside_reward.py").write_text("BONUS = 0.5\n")
    from lmpo.envs import parse_reward_weights, reward_functions

    spec = f"{installed_script}/rw.py:bonus=1"
    fns = reward_functions(parse_reward_weights(spec))
    task = make_task("sort_digits")
    with RewardRunner({name: (fn, 1.0) for name, fn in fns.items()}, timeout_s=20.0) as runner:
        scores = runner.score(task, [task.make("12345")], ["1"], [True])
    assert scores.components[f"{installed_script}/rw.py:bonus"].tolist() == [0.5] and scores.valid.all()


REWARDS = """import math


def ok(task, problems, completions, terminated):
    return [1.0 for _ in completions]


def three(task, problems, completions):
    return [1.0 for _ in completions]


class Scorer:
    def __call__(self, task, problems, completions, terminated):
        return [1.0 for _ in completions]


scorer = Scorer()
notcallable = 5
"""


@pytest.mark.parametrize("name, said", [
    ("okk", "has no function 'okk' \\(did you mean 'ok'\\?\\); its functions: ok, scorer, three$"),
    ("notcallable", "'notcallable' in module '.*rw.py' is an int, not a function"),
    ("Scorer", "Scorer is a class, and calling it makes an instance .*`scorer = Scorer\\(\\)`"),
    ("three", "cannot be called as fn\\(task, problems, completions, terminated\\): it takes "
              "\\(task, problems, completions\\)"),
])
def test_a_wrong_reward_name_is_refused_saying_what_the_module_has(name: str, said: str, tmp_path: Path):
    """A typo got no suggestion, 5 was 'no function', and a class passed the start-up check to
    make every completion of the run unscorable with `TypeError: Scorer() takes no arguments`."""
    from lmpo.envs.rewards import import_reward

    (tmp_path / "rw.py").write_text(REWARDS)
    with pytest.raises(ValueError, match=said):
        import_reward(f"{tmp_path}/rw.py:{name}")
    assert import_reward(f"{tmp_path}/rw.py:scorer")(None, [], ["a"], [True]) == [1.0]
