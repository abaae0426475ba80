"""A task's own episode limits (`max_turns`, `max_tokens`, `max_turn_tokens`,
`max_observation_chars`, `env_workers`) are checked when the task is made, before any model
loads, and a wrong one is said in one line naming the task, its file and the attribute."""

from __future__ import annotations

import re

import pytest

from lmpo.cli.main import main
from lmpo.envs import make_task

AGENT_TASK = '''
class WordLen:
    chat = True
    max_turns = 3
    max_turn_tokens = 20
    max_tokens = 60

    def grade(self, problem, completion, terminated):
        raise NotImplementedError

    def is_heldout(self, problem):
        return False

    def make_env(self):
        raise NotImplementedError
'''


def _task_file(tmp_path, old: str = "", new: str = "") -> str:
    path = tmp_path / "word_len.py"
    path.write_text(AGENT_TASK.replace(old, new))
    return f"{path}:WordLen"


@pytest.mark.parametrize("old,new,said", [
    ("max_tokens = 60", "max_tokens = 'sixty'", "max_tokens must be an integer >= 1 (token budget of an episode "
                                                 "after its prompt), got 'sixty' (str)"),
    ("max_turns = 3", "max_turns = 2.5", "max_turns must be an integer >= 1 (model turns an episode may take), "
                                         "got 2.5 (float)"),
    ("max_turn_tokens = 20", "max_turn_tokens = None", "max_turn_tokens must be an integer >= 0 (the cap on one "
                                                       "model turn, 0: the budget), got None (NoneType)"),
    ("chat = True", "chat = True\n    max_observation_chars = '512'", "max_observation_chars must be an integer"),
    ("chat = True", "chat = True\n    env_workers = True", "env_workers must be an integer >= 1"),
])
def test_a_limit_of_the_wrong_type_is_said_naming_the_task(tmp_path, old, new, said):
    """QA: `max_tokens = "sixty"` was a TypeError traceback from lmpo/trainers/validation.py."""
    spec = _task_file(tmp_path, old, new)
    with pytest.raises(ValueError, match="^" + re.escape(f"task WordLen ({tmp_path}/word_len.py): {said}")):
        make_task(spec)


def test_a_limit_of_the_wrong_type_stops_the_command_line_before_the_model_loads(tmp_path, capsys):
    spec = _task_file(tmp_path, "max_tokens = 60", "max_tokens = 'sixty'")
    out = tmp_path / "run"
    assert main(["train", "grpo", "--model", "tiny", "--task", spec, "--threads", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and not out.exists()
    assert f"lmpo: error: task WordLen ({tmp_path}/word_len.py): max_tokens must be an integer >= 1" in err


@pytest.mark.parametrize("old,new,said", [
    ("max_turns = 3", "max_turns = 0", "max_turns must be >= 1, got 0"),
    ("max_tokens = 60", "max_tokens = -5", "max_tokens must be >= 1, got -5"),
    ("max_turn_tokens = 20", "max_turn_tokens = -1", "max_turn_tokens must be >= 0, got -1"),
    ("chat = True", "chat = True\n    max_observation_chars = 0", "max_observation_chars must be >= 1, got 0"),
])
def test_a_limit_out_of_range_is_said_naming_the_task(tmp_path, old, new, said):
    spec = _task_file(tmp_path, old, new)
    with pytest.raises(ValueError, match="^" + re.escape(f"task WordLen ({tmp_path}/word_len.py): {said}") + "$"):
        make_task(spec)


def test_a_tasks_zero_turns_stops_the_command_line_before_the_model_loads(tmp_path, capsys):
    """QA: it said "max_turns must be >= 1, got 0" after the model loaded, naming no task; the
    user never gave --max_turns (and --max_turns 0 means the task's own)."""
    spec = _task_file(tmp_path, "max_turns = 3", "max_turns = 0")
    out = tmp_path / "run"
    assert main(["train", "grpo", "--model", "tiny", "--task", spec, "--threads", "1", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert not out.exists() and "[engine]" not in captured.out + captured.err
    assert captured.err.strip() == f"lmpo: error: task WordLen ({tmp_path}/word_len.py): max_turns must be >= 1, got 0"


@pytest.mark.parametrize("missing,said", [
    ("max_turns", "max_turns is missing: a task with make_env() declares the model turns an episode may take; "
                  "without it an episode has one turn, and every tool call ends it"),
    ("max_tokens", "max_tokens is missing: a task with make_env() declares the token budget of an episode after its "
                   "prompt; without it an episode gets --max_new_tokens' default of 12 tokens"),
])
def test_an_agent_task_without_its_turns_or_budget_is_refused(tmp_path, missing, said):
    """QA: a task with make_env and no max_turns ran one turn an episode, so every tool call
    ended it as max_turns (masked): it could never be solved, and nothing was said."""
    spec = _task_file(tmp_path, f"    {missing} = ", "    unused_limit = ")
    with pytest.raises(ValueError, match="^" + re.escape(f"task WordLen ({tmp_path}/word_len.py): {said}") + "$"):
        make_task(spec)


def test_a_multi_turn_task_without_make_env_is_refused(tmp_path, capsys):
    """QA: chat = True, tool_schemas() and max_turns = 3 without make_env trained as a
    single-turn task, without a word."""
    spec = _task_file(tmp_path, "    def make_env(self):", "    def make_environment(self):")
    out = tmp_path / "run"
    assert main(["train", "grpo", "--model", "tiny", "--task", spec, "--threads", "1", "--out", str(out)]) == 2
    assert not out.exists()
    assert capsys.readouterr().err.strip() == (
        f"lmpo: error: task WordLen ({tmp_path}/word_len.py): max_turns = 3 asks for multi-turn episodes, but the "
        "task has no make_env() to answer the model's turns, so each episode would end at its first answer; add "
        "make_env() (lmpo.envs.tool_env.ToolEnv does for most tasks), or drop max_turns")
    single_turn = tmp_path / "single_turn.py"
    single_turn.write_text(AGENT_TASK.replace("max_turns = 3", "max_turns = 1").replace("make_env", "make_environment"))
    assert make_task(f"{single_turn}:WordLen").chat  # a chat task of one turn needs no environment


def test_the_embedded_tasks_pass():
    from lmpo.envs import TASKS

    for spec in [*TASKS, "calculator:tool_format=hermes", "vault:tool_format=hermes"]:
        make_task(spec)
