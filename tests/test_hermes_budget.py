"""`tool_format=hermes` gets a turn cap and an episode budget that hold one of the task's own
calls. Before, calculator and vault kept the compact format's (20 and 16 tokens a turn, 48 an
episode), which a hermes call (85 characters) overruns: every call was cut off as turn_length,
accuracy 0, and nothing said why."""

from __future__ import annotations

import random
import re
import warnings
from types import SimpleNamespace

import pytest

from lmpo.envs import make_task
from lmpo.models import build_char_tokenizer
from lmpo.rollout import SamplingParams, run_episodes
from lmpo.rollout.agent_loop import limits_for
from lmpo.rollout.budget_warnings import warn_if_calls_overrun
from lmpo.rollout.render import renderer_for

from test_agent_loop import ScriptedEngine

TINY_CONTEXT = SimpleNamespace(max_position_embeddings=256)  # the tiny preset's


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.mark.parametrize("spec", ["calculator:tool_format=hermes", "vault:tool_format=hermes"])
def test_a_demonstrated_hermes_episode_fits_the_tasks_own_limits(tok, spec):
    task = make_task(spec)
    problem = task.train_problems(1, 0)[0]
    turns = [m["content"] for m in task._trace(problem, random.Random(0), flawed=False) if m["role"] == "assistant"]
    assert turns[0].startswith("<tool_call>")
    limits = limits_for(task, TINY_CONTEXT, task.max_tokens)
    (episode,) = run_episodes(ScriptedEngine(tok, {problem.prompt: turns}), task.make_env, [problem],
                              SamplingParams(max_new_tokens=task.max_tokens), limits, renderer_for(task, tok), tok)
    assert (episode.termination, episode.tool_calls) == ("answered", 1)  # was turn_length, no call
    assert task.grade(problem, episode.final_text, episode.terminated).correct


def test_the_compact_format_keeps_its_limits():
    assert [(make_task(s).max_turn_tokens, make_task(s).max_tokens) for s in ("calculator", "vault")] == \
        [(20, 48), (16, 48)]


def test_a_turn_cap_too_short_for_the_tasks_calls_is_said_at_start_up(tok):
    task = make_task("calculator:tool_format=hermes")
    with pytest.warns(UserWarning, match=r"calls take up to 85 tokens .* turn cap of 20 .* at least 86"):
        warn_if_calls_overrun(task, tok, limits_for(task, TINY_CONTEXT, 200, max_turn_tokens=20))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_calls_overrun(task, tok, limits_for(task, TINY_CONTEXT, task.max_tokens))
        warn_if_calls_overrun(make_task("calculator"), tok, limits_for(make_task("calculator"), TINY_CONTEXT, 48))


@pytest.mark.parametrize("spec", ["calculator", "vault", "aftersales", "calculator:tool_format=hermes"])
def test_an_episode_budget_the_demonstrations_nearly_fill_is_said_at_start_up(tok, spec):
    """QA: under a ChatML template vault's demonstrations took 46 of its 48 tokens, and a quarter
    of the sampled episodes ended as token_budget (untrained), with no word why. The tasks' own
    budgets leave room under the embedded template."""
    from lmpo.rollout.budget_warnings import warn_if_demonstrations_overrun

    task = make_task(spec)
    renderer = renderer_for(task, tok)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_demonstrations_overrun(task, renderer, tok, limits_for(task, TINY_CONTEXT, task.max_tokens))
    tight = limits_for(task, TINY_CONTEXT, task.max_tokens // 2)
    with pytest.warns(UserWarning, match=rf"demonstrations take up to \d+ tokens .* of the episode budget of "
                                         rf"{task.max_tokens // 2} .* raise --max_new_tokens to about \d+"):
        warn_if_demonstrations_overrun(task, renderer, tok, tight)


def test_an_evaluation_budget_too_short_names_its_own_option_once():
    """QA: with --max_new_tokens 70 a GRPO run on calculator warned before every evaluation that
    the budget of 48 (--eval_max_new_tokens, the task's own) was nearly full, but told the user to
    raise --max_new_tokens, which does not set it."""
    from lmpo.models import load_model_and_tokenizer
    from lmpo.rollout.evaluation import evaluate
    from lmpo.trainers.rl import RLConfig, eval_options

    model, tok = load_model_and_tokenizer("tiny", seed=0)
    task = make_task("calculator")
    problems = task.heldout_problems(2)
    options = {**eval_options(RLConfig(task="calculator")), "max_new_tokens": task.max_tokens // 2}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):  # three evaluations of one run
            evaluate(model, tok, task, problems, **options)
    said = [str(w.message) for w in caught if "demonstrations take" in str(w.message)]
    assert len(said) == 1, said
    assert f"budget of {task.max_tokens // 2} (--eval_max_new_tokens, or the task's own)" in said[0]
    assert re.search(r"raise --eval_max_new_tokens to about \d+$", said[0]), said[0]
