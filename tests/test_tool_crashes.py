"""A tool of the user's that raises something other than ToolError, and one that returns a dict.

Before: a tool's `KeyError` (a bug in the tool, say) reached the model as `error: KeyError: ...`,
counted as the model's malformed turn, and nothing told the person training, though the model
was being taught not to call the tool. A returned dict reached the model as Python's repr
(`{'city': 'Oslo', 'open': True}`), not as JSON."""

from __future__ import annotations

import json

import pytest

from lmpo.envs import Problem
from lmpo.envs.parsing import CompactFormat, ToolCall, execute_call
from lmpo.envs.tool_env import ToolEnv
from lmpo.envs.tools import ToolCrash, ToolError, ToolTimeout, tool
from lmpo.models import build_char_tokenizer
from lmpo.rollout import EpisodeLimits, SamplingParams, run_episodes
from lmpo.rollout.render import ChatRenderer
from lmpo.trainers.agent_metrics import trajectory_row
from lmpo.trainers.reward_watch import WatchedRewards

from test_agent_loop import ScriptedEngine


@tool
def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: the key.
    """
    table = {"a": "1"}
    if key == "refused":
        raise ToolError("no such key")
    return table[key]  # the bug: a missing key raises KeyError, not ToolError


@tool
def place(city: str) -> dict:
    """A place's record.

    Args:
        city: the city.
    """
    return {"city": city, "open": True, "rooms": [1, 2], "note": None}


def test_a_tool_that_raises_is_a_crash_naming_file_and_line():
    with pytest.raises(ToolCrash) as info:
        lookup.call({"key": "b"})
    assert str(info.value) == "KeyError: 'b'"  # what the model sees, as before
    assert info.value.description.startswith("lookup raised KeyError: 'b' (")
    line = next(i for i, text in enumerate(open(__file__), 1) if "# the bug" in text)
    assert info.value.description.endswith(f"{__file__}:{line})")
    with pytest.raises(ToolError) as refused:
        lookup.call({"key": "refused"})
    assert not isinstance(refused.value, ToolCrash)


def test_execute_call_lists_crashes_but_not_refusals():
    crashes: list[str] = []
    tools = {"lookup": lookup}
    assert execute_call(ToolCall("lookup", arguments={"key": "b"}), tools, crashes) == ("error: KeyError: 'b'", False)
    assert execute_call(ToolCall("lookup", arguments={"key": "refused"}), tools, crashes) == \
        ("error: no such key", False)
    assert execute_call(ToolCall("lookup", arguments={"key": "a"}), tools, crashes) == ("1", True)
    assert len(crashes) == 1 and crashes[0].startswith("lookup raised KeyError: 'b'")


@tool
def fetch(key: str) -> str:
    """Fetch a value over the network.

    Args:
        key: the key.
    """
    if key == "slow":
        raise TimeoutError("timed out")  # what socket and urllib raise when their deadline passes
    if key == "limit":
        raise ToolTimeout("timeout: the fetch took longer than 2 s")
    if key == "zero":
        raise ToolError("timeout must be positive")  # a refusal for the model, worded "timeout"
    return "error: timeout is 30 s in the config"  # a successful result that reads like an error


def _fetch_episode(key: str):
    env = ToolEnv(lambda p: [], lambda p: [fetch], CompactFormat())
    env.reset(None)
    return env.step(f"fetch({key})")


def test_only_a_tool_that_overran_its_time_limit_ends_the_episode_as_tool_timeout():
    """Before: any observation starting `error: timeout` ended the episode as tool_timeout
    (excluded), a successful result or a refusal alike, and a tool's TimeoutError was the model's
    parse error. Now the tool's ToolTimeout or TimeoutError does, and nothing else."""
    returned = _fetch_episode("ok")
    assert not returned.done
    assert returned.messages() == [{"role": "tool", "content": "error: timeout is 30 s in the config"}]
    assert returned.info["parse_error"] is False
    refused = _fetch_episode("zero")
    assert not refused.done and refused.info["parse_error"] is True
    assert refused.messages() == [{"role": "tool", "content": "error: timeout must be positive"}]
    for key in ("slow", "limit"):
        step = _fetch_episode(key)
        assert step.done and step.info["termination"] == "tool_timeout", key
    assert _fetch_episode("slow").info["error"].startswith("fetch: timeout: TimeoutError: timed out (")
    assert _fetch_episode("limit").info["error"] == "fetch: timeout: the fetch took longer than 2 s"
    with pytest.raises(ToolTimeout):
        execute_call(ToolCall("fetch", arguments={"key": "slow"}), {"fetch": fetch})


def test_tool_calls_count_only_the_calls_that_reached_a_tool():
    """Before: every call the model wrote counted, `foo(1)` for a tool that does not exist or a
    call with arguments that do not fit included, so eval's "called a tool" said 100% for a model
    that never reached one. Now a call counts when the tool's function ran (returned, refused,
    raised or timed out)."""
    from lmpo.envs.parsing import HermesFormat

    def block(name: str, arguments: dict) -> str:
        return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'

    env = ToolEnv(lambda p: [], lambda p: [lookup, fetch], HermesFormat())
    env.reset(None)
    cases = {  # turn: tool_calls
        block("foo", {"x": 1}): 0,
        block("lookup", {"key": 7}) + block("lookup", {"door": "a"}) + block("lookup", {}): 0,
        block("lookup", {"key": "a"}): 1,
        block("lookup", {"key": "refused"}) + block("lookup", {"key": "b"}) + block("foo", {}): 2,
        block("lookup", {"key": "a"}) + block("fetch", {"key": "slow"}): 2,
    }
    assert {turn: env.step(turn).info["tool_calls"] for turn in cases} == cases
    ran: list[str] = []
    assert execute_call(ToolCall("lookup", arguments={"key": 1}), {"lookup": lookup}, ran=ran) == (
        "error: lookup: argument 'key' must be a string, got integer 1", False)
    assert execute_call(ToolCall("lookup", arguments={"key": "a"}), {"lookup": lookup}, ran=ran) == ("1", True)
    assert ran == ["lookup"]


def test_a_returned_dict_or_list_reaches_the_model_as_json():
    assert json.loads(place.call({"city": "Oslo"})) == {"city": "Oslo", "open": True, "rooms": [1, 2], "note": None}
    assert place.call({"city": "Zürich"}).startswith('{"city": "Zürich"')  # readable, not \u escapes
    assert tool(_pair).call({}) == '[1, "x"]'
    odd = tool(_odd)
    assert odd.call({}) == str({"when": _Unserialisable()})  # not JSON-able: the repr, never an error


def _pair() -> tuple:
    """A tuple."""
    return 1, "x"


class _Unserialisable:
    def __repr__(self):
        return "<thing>"


def _odd() -> dict:
    """Returns something json cannot write."""
    return {"when": _Unserialisable()}


def test_crashes_reach_the_trajectory_its_row_and_the_terminal(tmp_path, capsys):
    tok = build_char_tokenizer()
    scripts = {"qA": ["lookup(b)", "lookup(c)", "lookup(d)", "lookup(e)", "1"], "qB": ["lookup(a)", "1"]}
    engine = ScriptedEngine(tok, scripts)
    env = lambda: ToolEnv(lambda p: [{"role": "user", "content": p.prompt}], lambda p: [lookup], CompactFormat())
    trajectories = run_episodes(engine, env, [Problem(prompt=k, answer="1") for k in scripts],
                                SamplingParams(max_new_tokens=64), EpisodeLimits(max_turns=6, max_tokens=400,
                                                                                 max_parse_errors=9),
                                ChatRenderer(tok), tok)
    crashed, clean = trajectories
    assert crashed.parse_errors == 4 and crashed.termination == "answered"
    assert [c.split(" (")[0] for c in crashed.info["tool_crashes"]] == [
        "lookup raised KeyError: 'b'", "lookup raised KeyError: 'c'", "lookup raised KeyError: 'd'"]  # first three
    assert "tool_crashes" not in clean.info
    row = trajectory_row(crashed, _Grade(), 0.0, tok, 1, "train", 0)
    assert row["tool_crashes"] == crashed.info["tool_crashes"]

    watched = WatchedRewards(_Runner(), tmp_path, max_unscorable_steps=3, memory_mb=0)
    watched.note_episodes(trajectories)
    watched.note_episodes([clean])
    err = capsys.readouterr().err
    assert err.count("[tools]") == 1
    assert "[tools] in 1 of 2 episodes a tool raised: lookup raised KeyError: 'b' (" in err
    assert "raise ToolError for the refusals meant for the model" in err


class _Grade:
    correct = 0.0


class _Runner:
    def close(self):
        pass


def test_lmpo_trajectories_shows_an_episodes_error_and_tool_crash():
    from lmpo.reports.trajectories import header_fields
    row = {"step": 1, "phase": "train", "index": 0, "reward": 0.0, "correct": False, "termination": "answered",
           "turns": 2, "tool_calls": 1, "parse_errors": 1, "num_tokens": 9, "num_model_tokens": 4,
           "tool_crashes": ["lookup raised KeyError: 'b' (tools.py:3)"]}
    assert ("tool crashed: lookup raised KeyError: 'b' (tools.py:3)", "bad") in header_fields(row)
    broken = {**row, "termination": "env_error", "error": "ValueError: boom", "tool_crashes": "not a list"}
    fields = header_fields(broken)
    assert ("error: ValueError: boom", "bad") in fields and not any(f.startswith("tool crashed") for f, _ in fields)
