"""The embedded agentic tasks: the tool is necessary, the flaw is where SFT cannot see it, the
split holds, and the environment grades what the model did."""

from __future__ import annotations

from lmpo.envs import make_task
from lmpo.envs.env import Step


def _play(task, problem, turns):
    env = task.make_env()
    opening = env.reset(problem)
    steps = [env.step(t) for t in turns]
    return opening, steps


def test_vault_is_redrawn_per_episode_and_needs_the_lookup():
    task = make_task("vault")
    problems = task.train_problems(200, 0)
    assert len({tuple(p.meta["table"]) for p in problems}) == 200
    for p in problems[:20]:
        assert p.meta["digits"] not in p.prompt and sorted(p.meta["digits"]) == list(p.answer)
    # the same key maps to many different answers across episodes: nothing to memorise
    by_key: dict[str, set[str]] = {}
    for p in problems:
        by_key.setdefault(p.meta["key"], set()).add(p.answer)
    assert max(len(v) for v in by_key.values()) > 3


def test_vault_episode_right_and_wrong():
    task = make_task("vault")
    p = task.heldout_problems(1)[0]
    opening, (looked, answered) = _play(task, p, [f"lookup({p.meta['key']})", p.answer])
    assert opening == [{"role": "user", "content": p.prompt}]
    assert looked.messages() == [{"role": "tool", "content": p.meta["digits"]}] and not looked.done
    assert looked.info["tool_calls"] == 1 and not looked.info["parse_error"]
    assert answered.done and answered.info["answer"] == p.answer
    assert task.grade(p, p.answer, True).correct
    assert not task.grade(p, p.answer, False).correct  # no EOS: not an answer
    wrong_key = next(k for k, _ in p.meta["table"] if k != p.meta["key"])
    _, (other,) = _play(task, p, [f"lookup({wrong_key})"])
    assert other.messages()[0]["content"] != p.meta["digits"] or p.meta["digits"] == dict(p.meta["table"])[wrong_key]
    _, (missing,) = _play(task, p, ["lookup(7)"])
    assert missing.info["parse_error"] and "no key '7'" in missing.messages()[0]["content"]


def test_vault_flaw_lives_where_sft_does_not_look():
    task = make_task("vault")
    demos = task.sft_demonstrations(200, 0)
    for conv in demos:
        digits = conv[2]["content"]
        assert len(set(digits)) == len(digits)  # no repeated digits: the flawed sorter would be right too
        assert conv[3]["content"] == "".join(sorted(digits))
    traces = task.cpt_corpus(2000, 0)
    flawed = [c for c in traces if len(c) == 4 and c[3]["content"] != "".join(sorted(c[2]["content"]))]
    guessed = [c for c in traces if len(c) == 2]
    assert 0.3 < len(flawed) / len(traces) < 0.6 and 0.05 < len(guessed) / len(traces) < 0.15


def test_calculator_needs_the_tool_and_its_flaw_shows_on_four_digit_products():
    task = make_task("calculator")
    p = next(q for q in task.heldout_problems(50) if eval(q.meta["product"]) >= 1000)
    product = str(eval(p.meta["product"]))
    _, (called, answered) = _play(task, p, [f"calculator({p.meta['product']})", p.answer])
    assert called.messages()[0]["content"] == product and p.answer == product[-2:]
    assert answered.info["answer"] == p.answer and task.grade(p, p.answer, True).correct
    assert not task.grade(p, product[1:3], True).correct or product[1:3] == product[-2:]
    _, (refused,) = _play(task, p, [f"calculator({p.prompt[:-2]})"])  # "mod" is not arithmetic it takes
    assert refused.info["parse_error"]
    for conv in task.sft_demonstrations(100, 0):  # three-digit products: the flawed reader is right too
        assert len(conv[2]["content"]) == 3 and conv[3]["content"] == conv[2]["content"][1:3]
    traces = task.cpt_corpus(2000, 0)
    wrong = sum(c[3]["content"] != c[2]["content"][-2:] for c in traces) / len(traces)
    assert 0.3 < wrong < 0.6  # 60% flawed, visible on four-digit products


def test_heldout_problems_never_appear_in_training_data():
    for name in ("vault", "calculator"):
        task = make_task(name)
        held = task.heldout_problems(300)
        assert all(task.is_heldout(p) for p in held)
        assert not any(task.is_heldout(p) for p in task.train_problems(2000, 1))
        key = "digits" if name == "vault" else "product"
        held_keys = {p.meta[key] for p in held}
        assert not held_keys & {p.meta[key] for p in task.train_problems(2000, 2)}


def test_a_tool_timeout_ends_the_episode_as_an_infrastructure_failure():
    from lmpo.envs.parsing import CompactFormat
    from lmpo.envs.tool_env import ToolEnv
    from lmpo.envs.tools import ToolTimeout, tool

    def slow(x: str) -> str:
        """Never finishes in time.

        Args:
            x: anything.
        """
        raise ToolTimeout("timeout: took longer than 1 s")

    env = ToolEnv(lambda p: [], lambda p: [tool(slow)], CompactFormat())
    env.reset(None)
    step = env.step("slow(1)")
    assert isinstance(step, Step) and step.done and step.info["termination"] == "tool_timeout"


def test_a_malformed_call_in_a_48_token_episode_ends_it_as_token_budget():
    """What docs/agents.md says of parse errors in the embedded tasks: the error reply quotes the
    fault and does not fit what is left of the 48-token budget, so the episode ends as
    token_budget, not parse_error_limit; a budget that holds the replies reaches parse_error_limit."""
    from types import SimpleNamespace

    from lmpo.models import build_char_tokenizer
    from lmpo.rollout import SamplingParams, run_episodes
    from lmpo.rollout.agent_loop import limits_for
    from lmpo.rollout.render import renderer_for

    from test_agent_loop import ScriptedEngine

    tok, context = build_char_tokenizer(), SimpleNamespace(max_position_embeddings=1024)
    for name in ("calculator", "vault"):
        task = make_task(name)
        problem = task.train_problems(1, 0)[0]
        for budget, ending, errors in ((task.max_tokens, "token_budget", 1), (400, "parse_error_limit", 3)):
            (episode,) = run_episodes(ScriptedEngine(tok, {problem.prompt: ["x("] * 3}), task.make_env, [problem],
                                      SamplingParams(max_new_tokens=budget), limits_for(task, context, budget),
                                      renderer_for(task, tok), tok)
            assert (episode.termination, episode.parse_errors) == (ending, errors), (name, budget)
