"""Tool calls read out of a model's turn (compact and hermes formats) and executed."""

import pytest

from lmpo.envs.parsing import (FORMATS, CompactFormat, HermesFormat, ParsedTurn, ToolCall, execute_call,
                               make_format)
from lmpo.envs.tools import CALCULATOR, ToolError, tool


@tool
def lookup(key: int, field: str = "value") -> str:
    """Look a key up.

    Args:
        key: The key.
        field: Which field.
    """
    if key < 0:
        raise ToolError(f"no key {key}")
    return f"{field} of {key}"


TOOLS = {"calculator": CALCULATOR, "lookup": lookup}


@pytest.mark.parametrize("text, call", [
    ("lookup(4821)", ToolCall("lookup", raw_arguments="4821")),
    ("  calculator(37*48+5)\n", ToolCall("calculator", raw_arguments="37*48+5")),
    ("f()", ToolCall("f", raw_arguments="")),
    ("_x1(a=1,\nb='two')", ToolCall("_x1", raw_arguments="a=1,\nb='two'")),
    ("calculator((1+2)*(3+4))", ToolCall("calculator", raw_arguments="(1+2)*(3+4)"))])
def test_compact_calls(text, call):
    assert CompactFormat().parse(text) == ParsedTurn(calls=(call,))


@pytest.mark.parametrize("text, message", [
    ("lookup(4821", "missing the closing ')'"), ("calculator(2*3) then done", "text after the closing ')'"),
    ("lookup(1)\nlookup(2) and more", "text after the closing ')'")])
def test_compact_malformed_calls(text, message):
    turn = CompactFormat().parse(text)
    assert turn.calls == () and turn.answer is None
    assert turn.error.startswith("malformed tool call: ") and message in turn.error


@pytest.mark.parametrize("text", ["1781", " The answer is 42.\n", "Paris (France)", "(3)", "", "3(4)"])
def test_compact_answers_are_unchanged(text):
    assert CompactFormat().parse(text) == ParsedTurn(answer=text)


def test_compact_render_call():
    compact = CompactFormat()
    assert compact.render_call(ToolCall("lookup", raw_arguments="4821")) == "lookup(4821)"
    assert compact.render_call(ToolCall("calculator", arguments={"expression": "2*3"})) == "calculator(2*3)"
    rendered = compact.render_call(ToolCall("lookup", arguments={"key": 5, "field": "name"}))
    assert rendered == "lookup(key=5, field='name')"
    assert execute_call(compact.parse(rendered).calls[0], TOOLS) == ("name of 5", True)


def test_hermes_calls():
    hermes = HermesFormat()
    one = '<tool_call>\n{"name": "lookup", "arguments": {"key": 7}}\n</tool_call>'
    assert hermes.parse(one) == ParsedTurn(calls=(ToolCall("lookup", arguments={"key": 7}),))
    many = ('Let me check both.\n<tool_call>{"name": "lookup", "arguments": {"key": 1}}</tool_call>\n'
            '<tool_call>\n  {"name": "calculator",\n   "arguments": {"expression": "2*3"}}  \n</tool_call> trailing')
    assert hermes.parse(many).calls == (ToolCall("lookup", arguments={"key": 1}),
                                        ToolCall("calculator", arguments={"expression": "2*3"}))
    no_arguments = hermes.parse('<tool_call>{"name": "now"}</tool_call>')
    assert no_arguments.calls == (ToolCall("now", arguments={}),)


@pytest.mark.parametrize("text, message", [
    ('<tool_call>{"name": "lookup", "arguments": {"key": 7}', "without a closing </tool_call>"),
    ('<tool_call>{"name": "lookup", "arguments": {"key": 7}</tool_call>', "invalid JSON"),
    ("<tool_call>lookup(7)</tool_call>", "invalid JSON"),
    ('<tool_call>{"arguments": {"key": 7}}</tool_call>', 'missing "name"'),
    ('<tool_call>{"name": "", "arguments": {}}</tool_call>', 'missing "name"'),
    ('<tool_call>{"name": "lookup", "arguments": "{\\"key\\": 7}"}</tool_call>', '"arguments" must be a JSON object'),
    ('<tool_call>{"name": "lookup", "arguments": [7]}</tool_call>', '"arguments" must be a JSON object, got list'),
    ('<tool_call>["lookup", 7]</tool_call>', "not an object"),
    ('<tool_call>{"name": "lookup", "arguments": {"key": ' + "[" * 5000 + "}}</tool_call>", "nested too deeply"),
    ('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": ', "without a closing")])
def test_hermes_malformed_calls(text, message):
    turn = HermesFormat().parse(text)
    assert turn.calls == () and turn.answer is None
    assert turn.error.startswith("malformed tool call: ") and message in turn.error


def test_hermes_answers_and_render():
    hermes = HermesFormat()
    assert hermes.parse("  The answer is 42.\n") == ParsedTurn(answer="The answer is 42.")
    assert hermes.parse("no call here </tool_call>") == ParsedTurn(answer="no call here </tool_call>")
    call = ToolCall("lookup", arguments={"key": 3, "field": "é"})
    rendered = hermes.render_call(call)
    assert rendered == '<tool_call>\n{"name": "lookup", "arguments": {"key": 3, "field": "é"}}\n</tool_call>'
    assert hermes.parse(rendered) == ParsedTurn(calls=(call,))
    with pytest.raises(ValueError, match="parsed arguments"):
        hermes.render_call(ToolCall("calculator", raw_arguments="1+1"))


def test_make_format():
    assert set(FORMATS) == {"compact", "hermes"}
    assert isinstance(make_format("compact"), CompactFormat) and make_format("hermes").name == "hermes"
    with pytest.raises(ValueError, match="unknown tool-call format 'xml'; known: compact, hermes"):
        make_format("xml")


def test_execute_call():
    assert execute_call(ToolCall("calculator", raw_arguments="8731*9462"), TOOLS) == ("82612722", True)
    assert execute_call(ToolCall("lookup", arguments={"key": 3}), TOOLS) == ("value of 3", True)
    assert execute_call(ToolCall("lookup", raw_arguments="3, field='name'"), TOOLS) == ("name of 3", True)
    assert execute_call(ToolCall("search", raw_arguments="x"), TOOLS) == (
        "error: unknown tool 'search'; available: calculator, lookup", False)
    failures = [(ToolCall("lookup", arguments={"key": "3"}), "error: lookup: argument 'key' must be an integer"),
                (ToolCall("lookup", arguments={}), "error: lookup: missing required argument 'key'"),
                (ToolCall("lookup", arguments={"key": 1, "x": 2}), "error: lookup: unknown argument 'x'"),
                (ToolCall("lookup", raw_arguments="key=oops"), "error: lookup: argument 'key' must be a literal"),
                (ToolCall("lookup", arguments={"key": -1}), "error: no key -1"),
                (ToolCall("calculator", raw_arguments="1/0"), "error: division by zero"),
                (ToolCall("calculator", raw_arguments="__import__('os')"), "error: function calls are not allowed")]
    for call, prefix in failures:
        observation, ok = execute_call(call, TOOLS)
        assert not ok and observation.startswith(prefix), observation


def test_a_turn_end_to_end_in_both_formats():
    compact = CompactFormat().parse("calculator(3*(4+5))")
    hermes = HermesFormat().parse('<tool_call>{"name": "calculator", "arguments": {"expression": "3*(4+5)"}}'
                                  "</tool_call>")
    assert [execute_call(turn.calls[0], TOOLS) for turn in (compact, hermes)] == [("27", True)] * 2
