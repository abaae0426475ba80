"""A task's `env_workers`: its environments run at once, each episode's on one thread of its own,
with the same trajectories as one after another."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
import _thread

import pytest
import torch

from lmpo.envs import Problem, make_task
from lmpo.envs.env import SingleTurnEnv, Step
from lmpo.envs.parsing import CompactFormat
from lmpo.envs.tool_env import ToolEnv
from lmpo.envs.tools import tool
from lmpo.models import build_char_tokenizer
from lmpo.rollout import EpisodeLimits, SamplingParams, run_episodes
from lmpo.rollout.agent_loop import EpisodeRunner, env_workers_of
from lmpo.rollout.env_workers import EnvWorkers
from lmpo.rollout.render import ChatRenderer
from test_agent_loop import ScriptedEngine, _Raising, _env_with, _lookup


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def _episodes(tok, scripts, make_env, workers, limits=EpisodeLimits(max_turns=3, max_tokens=64)):
    problems = [Problem(prompt=name, answer="11345") for name in scripts]
    return run_episodes(ScriptedEngine(tok, scripts), make_env, problems, SamplingParams(max_new_tokens=64), limits,
                        ChatRenderer(tok), tok, env_workers=workers)


def _record(traj):
    return (traj.token_ids, traj.sources, traj.logprobs, traj.turn_rewards, traj.termination, traj.final_text,
            traj.tool_calls, traj.parse_errors, traj.info)


def test_workers_give_the_same_trajectories_as_one_after_another(tok):
    scripts = {"qA": ["lookup(1)", "11345"], "qB": ["lookup(9)", "lookup(1)", "11345"], "qC": ["lookup(1"],
               "qD": ["lookup(slow)"], "qE": ["11345"], "qF": ["lookup(big)", "7"], "qG": ["lookup(1)"] * 3}
    one = _episodes(tok, scripts, _env_with([_lookup()]), 1)
    for workers in (2, 4, 16):
        assert [_record(t) for t in _episodes(tok, scripts, _env_with([_lookup()]), workers)] == [_record(t) for t in one]
    assert {t.termination for t in one} >= {"answered", "tool_timeout", "token_budget", "max_turns"}


def test_the_environments_of_a_batch_run_at_once(tok):
    """Four episodes' calls meet at a barrier: one after another, the first would wait alone."""
    meeting = threading.Barrier(4, timeout=10)

    def meet(key: str) -> str:
        """Wait for the other episodes.

        Args:
            key: anything.
        """
        meeting.wait()
        return "31415"

    scripts = {f"q{i}": ["meet(1)", "31415"] for i in range(4)}
    trajs = _episodes(tok, scripts, _env_with([tool(meet)]), 4)
    assert [t.termination for t in trajs] == ["answered"] * 4
    assert [t.tool_calls for t in trajs] == [1] * 4


class _ThreadBound(SingleTurnEnv):
    """Holds a sqlite3 connection as Python opens it by default: usable only on the thread that made it."""

    def __init__(self):
        super().__init__()
        self.threads = [threading.get_ident()]
        self.db = sqlite3.connect(":memory:")

    def reset(self, problem):
        self.threads.append(threading.get_ident())
        self.db.execute("CREATE TABLE t (x)")
        return super().reset(problem)

    def step(self, action_text):
        self.threads.append(threading.get_ident())
        self.db.execute("INSERT INTO t VALUES (1)")
        count = self.db.execute("SELECT COUNT(*) FROM t").fetchone()[0]
        if count < 2:
            return Step(f"again ({count})")
        return Step(done=True, info={"answer": action_text, "verdict": sorted(set(self.threads))})


def test_one_episodes_environment_lives_on_one_thread(tok):
    scripts = {f"q{i}": ["1", "2", "3"] for i in range(6)}
    trajs = _episodes(tok, scripts, _ThreadBound, 3)
    assert [t.termination for t in trajs] == ["answered"] * 6, [t.info for t in trajs]
    threads = [t.info["verdict"] for t in trajs]
    assert all(len(ids) == 1 for ids in threads)  # created, reset and stepped on one thread
    assert len({ids[0] for ids in threads}) == 3 and threading.get_ident() not in {ids[0] for ids in threads}


def test_an_environment_that_raises_ends_its_episode_only(tok):
    scripts = {"qA": ["x"], "qB": ["y"]}
    trajs = _episodes(tok, scripts, _Raising, 2)
    assert [t.termination for t in trajs] == ["env_error", "env_error"]
    assert trajs[0].info["error"].startswith("_Raising.step raised RuntimeError: the environment broke (")


class _Exits(SingleTurnEnv):
    def step(self, action_text):
        raise SystemExit(3)


class _BrokenFactory:
    def __init__(self):
        raise OSError("no sandbox")


@pytest.mark.parametrize("workers", [1, 3])
def test_an_environment_that_exits_ends_its_episode_one_by_one_or_with_workers(tok, workers):
    """sys.exit() in a step ended the run, with exit code 0 and no word, when it was not on a worker thread."""
    trajs = _episodes(tok, {"qA": ["x"], "qB": ["y"]}, _Exits, workers)
    assert [t.termination for t in trajs] == ["env_error", "env_error"]
    assert trajs[0].info["error"].startswith("_Exits.step raised SystemExit: 3 (")
    # a factory that raises ends its episodes as env_error, as a reset that raises does, one by one or not
    (traj,) = _episodes(tok, {"qA": ["x"]}, _BrokenFactory, workers)
    assert traj.termination == "env_error" and traj.info["error"].startswith("_BrokenFactory raised OSError: no sandbox (")


def test_ctrl_c_ends_the_run_while_a_tool_never_returns(tok):
    release = threading.Event()

    def hang(key: str) -> str:
        """Never return (until the test lets go).

        Args:
            key: anything.
        """
        release.wait(60)
        return "late"

    # Ctrl-C as a run gets it: Python's own handler (a library earlier in the suite may have set another)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.5, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            _episodes(tok, {"qA": ["hang(1)", "x"], "qB": ["hang(2)", "y"]}, _env_with([tool(hang)]), 2)
    finally:
        timer.cancel()
        release.set()
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("value", [0, -2, 1.5, True, "4"])
def test_a_tasks_env_workers_must_be_a_positive_integer(value):
    task = make_task("calculator")
    task.env_workers = value
    with pytest.raises(ValueError, match=r"task Calculator: env_workers must be a positive integer .* got "):
        env_workers_of(task)
    with pytest.raises(ValueError, match="env_workers must be a positive integer"):
        EnvWorkers(value)


@pytest.mark.parametrize("name", ["calculator", "vault"])
def test_an_embedded_tool_task_samples_the_same_with_workers(name, tiny_llama):
    """The real engine and environments (vault: a SQLite table per episode, made at reset)."""
    tokenizer = build_char_tokenizer()
    task = make_task(name)
    problems = task.train_problems(6, seed=0)
    runs = []
    for workers in (1, 3):
        task.env_workers = workers
        runner = EpisodeRunner.for_task(task, tiny_llama, tokenizer, SamplingParams(max_new_tokens=40),
                                        generator=torch.Generator().manual_seed(5))
        assert runner.env_workers == workers
        runs.append([_record(t) for t in runner.run(problems)])
    assert runs[0] == runs[1]


TASK = '''
from lmpo.envs.tool_tasks import Calculator

class MyCalc(Calculator):
    def __init__(self, env_workers: int = 1):
        super().__init__()
        self.env_workers = env_workers
'''


def test_a_task_option_sets_env_workers_for_a_training_run(tmp_path, monkeypatch):
    """`--task 'file.py:Class?env_workers=3'` trains exactly as one worker does."""
    import json

    from lmpo.cli.main import main
    from test_user_env_failures import RUN

    (tmp_path / "my_calc.py").write_text(TASK)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LMPO_TASK_FILES", raising=False)
    logs = []
    for workers in (1, 3):
        out = f"run{workers}"
        assert main(["train", "grpo", *RUN, "--task", f"my_calc.py:MyCalc?env_workers={workers}", "--out", out,
                     "--save_trajectories", "4"]) == 0
        rows = [json.loads(line) for line in (tmp_path / out / "metrics.jsonl").read_text().splitlines()]
        logs.append([{k: v for k, v in row.items() if not k.startswith("time")} for row in rows])
        logs.append((tmp_path / out / "trajectories.jsonl").read_text())
    assert logs[0] == logs[2] and logs[1] == logs[3]


class _Hangs(SingleTurnEnv):
    """Never answers a turn that says `hang` (until the test lets go); answers any other at once."""

    release = threading.Event()

    def reset(self, problem):
        if problem.prompt == "qOpen":
            self.release.wait(60)
        return super().reset(problem)

    def step(self, action_text):
        if action_text == "hang":
            self.release.wait(60)
        return super().step(action_text)


@pytest.mark.parametrize("workers", [1, 2])
def test_an_environment_that_never_returns_is_given_up_at_the_tasks_env_timeout(tok, workers):
    """Before: a step (or reset) that never returned held the run forever (SIGTERM only asked it to
    stop after the step). With the task's `env_timeout` its episode ends as tool_timeout, and the
    episodes queued behind it on the same thread still run."""
    scripts = {"qA": ["hang"], "qB": ["11345"], "qC": ["x"], "qOpen": ["y"]}
    problems = [Problem(prompt=name, answer="11345") for name in scripts]
    _Hangs.release.clear()
    start = time.monotonic()
    try:
        trajs = run_episodes(ScriptedEngine(tok, scripts), _Hangs, problems, SamplingParams(max_new_tokens=64),
                             EpisodeLimits(max_turns=3, max_tokens=64), ChatRenderer(tok), tok, env_workers=workers,
                             env_timeout=0.5)
    finally:
        _Hangs.release.set()
    assert time.monotonic() - start < 10
    assert [t.termination for t in trajs] == ["tool_timeout", "answered", "answered", "tool_timeout"]
    assert trajs[0].info["error"].startswith("the environment's step did not return within the task's env_timeout "
                                             "of 0.5 s")
    assert trajs[3].info["error"].startswith("the environment's make_env() and reset did not return")
    assert trajs[1].final_text == "11345"
