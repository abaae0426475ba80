"""A user's own environment and reward module when they go wrong, and a task given as a file with a
reward function of the user's: what the trainer says and does.

Before: an environment whose `step` raised on every turn trained on nothing and exited 0 with a
saved model, saying only `reward 0`; one that returned None or a tuple failed deep in the agent
loop (`'NoneType' object has no attribute 'reward'`); a NaN turn reward was trained on as NaN;
a reward module with a SyntaxError gave a 20-frame traceback; and `--task file.py:Class` with a
reward function of the user's left every completion unscorable (the reward worker could not
unpickle the task: `No module named 'lmpo_task_...'`)."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lmpo.cli.main import main
from lmpo.envs.env import Step, check_step

HERE = Path(__file__).resolve().parent
RUN = ["--model", "tiny", "--steps", "2", "--prompts_per_step", "2", "--group_size", "2", "--eval_problems", "0",
       "--threads", "1", "--max_turn_tokens", "200", "--max_new_tokens", "220", "--reward_timeout", "0"]
ENV = '''
import os, signal, sys, time
from lmpo.envs.env import Step
from lmpo.envs.tool_tasks import Calculator

class Env:
    def __init__(self, mode):
        if mode == "init_raise": raise OSError("my database is missing")
        self.mode = mode
    def reset(self, problem):
        if self.mode == "reset_raise": raise KeyError("my reset is broken")
        if self.mode == "reset_text": return problem.prompt
        return [{"role": "user", "content": problem.prompt}]
    def step(self, text):
        if self.mode == "raise": raise ValueError("my step is broken")
        if self.mode == "sys_exit": sys.exit(0)
        if self.mode == "os_exit": os._exit(0)
        if self.mode == "hang": os.kill(os.getpid(), signal.SIGTERM); time.sleep(3600)
        if self.mode in ("grade_hang", "answer"): return Step(done=True, info={"answer": text})
        if self.mode == "none": return None
        return Step(done=True, reward=float("nan"), info={"answer": text})

class MyTask(Calculator):
    def __init__(self, mode: str = "raise"): super().__init__(); self.mode = mode
    def make_env(self):
        if self.mode == "no_return": Env(self.mode)
        else: return Env(self.mode)
    def grade(self, problem, completion, terminated):
        if self.mode == "grade_hang": os.kill(os.getpid(), signal.SIGTERM); time.sleep(3600)
        return super().grade(problem, completion, terminated)

def slow_reward(task, problems, completions, terminated):
    os.kill(os.getpid(), signal.SIGTERM); time.sleep(3600)
'''


class Env:
    pass


@pytest.mark.parametrize("returned,says", [
    (None, "Env.step returned NoneType; expected a Step(observation: str or a list of {role, content} messages"),
    (("hi", 0.0, False, {}), "Env.step returned tuple; expected a Step("),
    (Step(reward=float("nan")), "Env.step returned a Step with reward nan; expected"),
    (Step(reward="0.5"), "returned a Step with reward '0.5'"),
    (Step(observation=12345), "returned a Step with observation int"),
    (Step(observation=[{"role": "tool"}, 3]), "returned a Step with observation list"),
    (Step(info=None), "returned a Step with info NoneType"),
    (Step(done="no"), "returned a Step with done 'no'; expected"),  # before: the episode ended, as env_done
    (Step(done=None), "returned a Step with done None; expected"),
    (Step(done=True, info={"termination": "my_reason"}), "info['termination'] 'my_reason' (one of answered, "),
    # before: `invalid literal for int()`, a traceback from the loop, or a string kept letter by letter
    (Step(info={"tool_calls": "many"}), "info['tool_calls'] 'many' (a count: an int of 0 or more)"),
    (Step(info={"tool_calls": None}), "info['tool_calls'] None"),
    (Step(info={"counts": ["blocked"]}), "info['counts'] ['blocked'] (a dict of name: int)"),
    (Step(info={"tool_crashes": "boom"}), "info['tool_crashes'] 'boom' (a list of str)"),
    (Step("obs", info={"termination": "env_done"}), "info['termination'] 'env_done' without done=True"),
])
def test_a_malformed_step_is_named_by_the_environments_class(returned, says):
    with pytest.raises(ValueError) as info:
        check_step(Env(), returned)
    assert says in str(info.value)
    assert check_step(Env(), Step("ok", 0.5, False, {"tool_calls": 1})).reward == 0.5


def _line(text: str) -> int:
    """The line of ENV, as written to its file, that holds `text`."""
    return next(n for n, line in enumerate(ENV.splitlines(), 1) if text in line)


@pytest.mark.parametrize("mode,cause", [
    ("raise", "Env.step raised ValueError: my step is broken (min_env.py:{raise})"),
    # both ended the run in silence with exit code 0, and no model
    ("sys_exit", "Env.step raised SystemExit: 0 (min_env.py:{sys_exit})"),
    ("os_exit", "Env.step called os._exit(0) (min_env.py:{os_exit})"),
    ("none", "Env.step (min_env.py:{step}) returned NoneType; expected a Step("),
    ("nan", "Env.step (min_env.py:{step}) returned a Step with reward nan"),
    ("reset_raise", "Env.reset raised KeyError: 'my reset is broken' (min_env.py:{reset_raise})"),
    ("reset_text", "Env.reset (min_env.py:{reset}) returned str; expected a list of {{role, content}}"),
    # a 20-frame traceback from the agent loop before
    ("init_raise", "MyTask.make_env raised OSError: my database is missing (min_env.py:{init_raise})"),
    # before: `NoneType.reset raised AttributeError: 'NoneType' object has no attribute 'reset'`
    ("no_return", "MyTask.make_env returned NoneType, not an environment (an object with reset(problem) and "
                  "step(text)); a make_env without `return`?"),
])
def test_a_run_whose_environment_breaks_every_episode_stops_saying_why(tmp_path, monkeypatch, capsys, mode, cause):
    """Before, the error named no place in the user's file (`ValueError: my step is broken`, `Env.step
    returned NoneType`): now the line that raised, or the method that returned the wrong thing."""
    (tmp_path / "min_env.py").write_text(ENV)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["train", "grpo", *RUN, "--task", f"min_env:MyTask?mode={mode}", "--out", "run"]) == 1
    err = capsys.readouterr().err
    cause = cause.format(step=_line("def step"), reset=_line("def reset"), reset_raise=_line("my reset is broken"),
                         init_raise=_line("my database is missing"), sys_exit=_line("sys.exit(0)"),
                         os_exit=_line("os._exit(0)"),
                         **{"raise": _line("my step is broken")})
    # the module is imported once per session, from the first test's directory
    said = re.escape(f"[env] 4 of 4 episodes ended in env_error: {cause}").replace("min_env\\.py", r"/\S+/min_env\.py")
    assert re.search(said, err), err
    assert err.strip().splitlines()[-1].startswith("lmpo: error: every episode of all 2 rounds ended in an "
                                                   "environment failure; the last: env_error: ")
    assert not (tmp_path / "run" / "model").exists()  # no model trained on nothing


def test_a_reward_module_with_a_syntax_error_is_one_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "syn_rew.py").write_text("def f(:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["train", "grpo", *RUN, "--rewards", "syn_rew:f=1.0", "--out", "run"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"lmpo: error: reward function 'syn_rew:f': importing module 'syn_rew' failed: SyntaxError: invalid "
        f"syntax ({tmp_path / 'syn_rew.py'}:1)")


def test_a_task_from_a_file_scores_with_the_users_reward_function(tmp_path, monkeypatch, capsys):
    shutil.copy(HERE / "data" / "user_task.py", tmp_path / "my_task.py")
    (tmp_path / "my_rewards.py").write_text(
        "def length_bonus(task, problems, completions, terminated):\n"
        "    return [-len(c) / 100 for c in completions]\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("LMPO_TASK_FILES", raising=False)
    assert main(["train", "grpo", *RUN, "--task", "my_task.py:Reverse",
                 "--rewards", "correct=1.0,my_rewards:length_bonus=0.2", "--out", "run"]) == 0
    assert "could not score" not in capsys.readouterr().err


def test_a_run_killed_inside_its_environment_says_which_call(tmp_path):
    """The OOM killer (SIGKILL) in a step, or native code calling exit(): the run ended with no
    word (`Killed`, exit 137) on which environment, episode and problem it was running."""
    (tmp_path / "min_env.py").write_text(ENV + "\nimport signal\nEnv.step = lambda self, text: "
                                         "os.kill(os.getpid(), signal.SIGKILL)\n")
    done = subprocess.run([sys.executable, "-m", "lmpo", "train", "grpo", *RUN, "--task", "min_env.py:MyTask",
                           "--out", "run"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert re.search(r"lmpo: error: the trainer \(pid \d+\) ended while Env.step of episode 0 \(prompt '.*'\) was "
                     r"running, without a word: it was killed \(by the kernel's OOM killer", done.stderr), done.stderr


def test_the_watcher_is_silent_when_the_process_ends_outside_user_code():
    code = ("from lmpo.envs.user_calls import inside\n"
            "with inside(lambda: 'MyEnv.step of episode 0'):\n    pass\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done


@pytest.mark.parametrize("mode,stuck,rewards", [
    ("hang", r"Env\.step of episode 0 \(prompt '.*'\)", []),
    ("grade_hang", r"task 'calculator': MyTask\.grade\(\) on the completion .* of the prompt '.*'", []),
    # a reward function of the user's, called in the trainer's process (--reward_timeout 0)
    ("answer", r"reward function 'min_env:slow_reward' on 4 completions",
     ["--rewards", "correct=1.0,min_env:slow_reward=0.5"]),
])
def test_sigterm_stops_a_run_stuck_in_the_users_code(tmp_path, monkeypatch, capsys, mode, stuck, rewards):
    """A step or a grader that never returns: the first SIGTERM did nothing (the run waited for
    the step to end), and a second one killed it with no word on where it was stuck."""
    from lmpo.trainers import preemption

    (tmp_path / "min_env.py").write_text(ENV)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(preemption, "STUCK_GRACE_S", 0.5, raising=False)
    assert main(["train", "grpo", *RUN, "--task", f"min_env:MyTask?mode={mode}", *rewards, "--out", "run"]) == 143
    err = capsys.readouterr().err.splitlines()
    assert re.fullmatch(f"lmpo: SIGTERM: {stuck} has not returned 0.5 s after the signal; the run stops without "
                        f"finishing its step", err[-2]), err
    assert err[-1] == ("lmpo: run has no complete checkpoint yet (they come every --save_every steps); "
                       "`lmpo train grpo --resume run` starts it over with its options")


def test_a_call_of_user_code_that_does_not_return_is_said():
    """A grader or a step that loops forever said nothing at all: the run just stood still."""
    code = ("import time\nfrom lmpo.envs import user_calls\nuser_calls.WARN_AFTER_S = 0.5\n"
            "with user_calls.inside(lambda: 'MyTask.grade() on the completion 12'):\n    time.sleep(4)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == (
        "lmpo: warning: MyTask.grade() on the completion 12 has run 0.5 s and not returned; lmpo sets it no time "
        "limit (an environment's calls take the task's env_timeout): Ctrl-C or SIGTERM stops the run\n"), done
