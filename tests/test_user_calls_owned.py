"""Only a user's task's calls are watched (`lmpo.envs.user_calls`): lmpo's own tasks' environments
and graders are called ~200 times a GRPO step, where the watcher's writes would cost milliseconds."""

import functools

import pytest

from lmpo.envs import make_task, user_calls
from lmpo.envs.env import env_factory
from lmpo.rollout import agent_loop, evaluation
from lmpo.rollout.trajectory import Trajectory


class MyCalculator(type(make_task("calculator"))):
    """A user's task: a subclass of a built-in one, defined outside lmpo."""


def my_factory():
    return env_factory(make_task("calculator"))()


@pytest.mark.parametrize("code, owned", [
    (env_factory(make_task("sort_digits")), True),  # SingleTurnEnv
    (env_factory(make_task("calculator")), True),
    (make_task("calculator").grade, True),
    (env_factory(MyCalculator()), False),
    (MyCalculator().grade, False),
    (my_factory, False),
    (functools.partial(my_factory), False),
])
def test_lmpo_owned_is_lmpos_own_tasks_only(code, owned):
    assert user_calls.lmpo_owned(code) is owned


@pytest.fixture
def watched_calls(monkeypatch):
    calls = []

    def counting(describe, started=None):
        calls.append(describe())
        return user_calls.nullcontext()

    monkeypatch.setattr(user_calls, "inside", counting)
    return calls


def test_a_built_in_tasks_episode_and_grade_are_not_watched_a_users_are(watched_calls):
    for task in (make_task("calculator"), MyCalculator()):
        problem = task.train_problems(1, 0)[0]
        env, _, error = agent_loop._open(env_factory(task), problem, 0)
        assert error is None
        agent_loop._step(env, "calculator(2*3)", 0, problem, env_factory(task))
        episode = Trajectory(problem=problem, prompt_length=0)
        evaluation.grade_all(task, [episode])
    assert [c.split(" of ")[0] for c in watched_calls[:3]] == [
        "_ToolTask.make_env()", "ToolEnv.reset", "ToolEnv.step"]
    assert len(watched_calls) == 4 and watched_calls[3].startswith("task 'calculator': MyCalculator.grade()")
