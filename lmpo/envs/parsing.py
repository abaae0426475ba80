"""Reading tool calls out of a model's turn, in the format its chat template teaches, and
running them: a turn is either calls, a final answer, or a parse error the model is told about."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from lmpo.envs.tools.schema import BadArguments, Tool, ToolCrash, ToolError, ToolTimeout, clip


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict | None = None
    """Parsed JSON arguments (hermes format)."""
    raw_arguments: str | None = None
    """The raw text between the parentheses (compact format)."""


@dataclass(frozen=True)
class ParsedTurn:
    calls: tuple[ToolCall, ...] = ()
    answer: str | None = None
    """The final answer, when the turn makes no call."""
    error: str | None = None
    """A parse error, phrased for the model ("malformed tool call: ...")."""


class ToolCallFormat(Protocol):
    name: str

    def parse(self, text: str) -> ParsedTurn:
        """The calls, the answer or the error in one model turn."""

    def render_call(self, call: ToolCall) -> str:
        """The text a model should write for `call` (for demonstrations)."""


_COMPACT_CALL = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\((.*)\)$", re.DOTALL)
_COMPACT_START = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\(")


class CompactFormat:
    """For the small char-level models: a turn that is exactly ``name(arguments)`` —
    ``lookup(4821)``, ``calculator(37*48+5)`` — is one call; any other turn is the answer."""

    name = "compact"

    def parse(self, text: str) -> ParsedTurn:
        stripped = text.strip()
        match = _COMPACT_CALL.match(stripped)
        if match:
            return ParsedTurn(calls=(ToolCall(match[1], raw_arguments=match[2]),))
        start = _COMPACT_START.match(stripped)
        if start:
            if ")" not in stripped[start.end():]:
                return ParsedTurn(error=f"malformed tool call: missing the closing ')' in {clip(stripped, 60)!r}")
            return ParsedTurn(error="malformed tool call: text after the closing ')'; "
                                    "a call must be the whole turn, like name(arguments)")
        if _OPEN in stripped:  # what a Qwen-style template teaches, taken for an answer it would be graded as one
            return ParsedTurn(error="a <tool_call> block, but this environment reads calls written as "
                                    "name(arguments), the whole turn (lmpo's tool tasks take tool_format=hermes)")
        return ParsedTurn(answer=text)

    def render_call(self, call: ToolCall) -> str:
        if call.raw_arguments is not None:
            return f"{call.name}({call.raw_arguments})"
        arguments = call.arguments or {}
        if len(arguments) == 1 and isinstance(next(iter(arguments.values())), str):
            return f"{call.name}({next(iter(arguments.values()))})"
        return f"{call.name}({', '.join(f'{key}={value!r}' for key, value in arguments.items())})"


_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


class HermesFormat:
    """Qwen2/2.5 and Hermes chat templates: one or more
    ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks; text outside them is
    ignored. A turn without ``<tool_call>`` is the answer."""

    name = "hermes"

    def parse(self, text: str) -> ParsedTurn:
        if _OPEN not in text:
            return ParsedTurn(answer=text.strip())
        calls = []
        position = text.find(_OPEN)
        while position != -1:
            start = position + len(_OPEN)
            end = text.find(_CLOSE, start)
            if end == -1:
                return ParsedTurn(error=f"malformed tool call: {_OPEN} without a closing {_CLOSE}")
            call = _hermes_call(text[start:end].strip())
            if isinstance(call, str):
                return ParsedTurn(error=f"malformed tool call: {call}")
            calls.append(call)
            position = text.find(_OPEN, end + len(_CLOSE))
        return ParsedTurn(calls=tuple(calls))

    def render_call(self, call: ToolCall) -> str:
        if call.arguments is None and call.raw_arguments:
            raise ValueError(f"a hermes call needs parsed arguments, not raw text ({call.raw_arguments!r})")
        payload = json.dumps({"name": call.name, "arguments": call.arguments or {}}, ensure_ascii=False)
        return f"{_OPEN}\n{payload}\n{_CLOSE}"


def _hermes_call(body: str) -> ToolCall | str:
    """The call in one block's JSON, or what is wrong with it."""
    expected = 'expected {"name": "...", "arguments": {...}}'
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as error:
        return f"invalid JSON ({error.msg} at character {error.pos}); {expected}"
    except RecursionError:  # `[[[[...` thousands deep: the model's malformed turn, not the environment's failure
        return f"the JSON is nested too deeply to read; {expected}"
    if not isinstance(payload, dict):
        return f"the JSON is not an object; {expected}"
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return f'missing "name"; {expected}'
    arguments = payload.get("arguments", {})
    if not isinstance(arguments, dict):
        return f'"arguments" must be a JSON object, got {type(arguments).__name__}; {expected}'
    return ToolCall(name, arguments=arguments)


FORMATS: dict[str, Callable[[], ToolCallFormat]] = {"compact": CompactFormat, "hermes": HermesFormat}


def make_format(name: str) -> ToolCallFormat:
    """A fresh tool-call format by name; ValueError listing the known names otherwise."""
    if name not in FORMATS:
        raise ValueError(f"unknown tool-call format {name!r}; known: {', '.join(FORMATS)}")
    return FORMATS[name]()


def execute_call(call: ToolCall, tools: dict[str, Tool], crashes: list[str] | None = None,
                 ran: list[str] | None = None) -> tuple[str, bool]:
    """Run `call` on `tools`: (observation, ok). An unknown tool, bad arguments or a refusal
    (ToolError) is an observation starting ``error:`` with ok False. A tool that raised something
    else (ToolCrash) is also appended to `crashes`, for its owner to see. A tool that overran its
    time limit (ToolTimeout) is raised on: no observation follows it, the episode ends. The call's
    tool name is appended to `ran` when the call reached the tool's function (it returned,
    refused, crashed or timed out), not for an unknown tool or arguments that do not fit."""
    chosen = tools.get(call.name)
    if chosen is None:
        return f"error: unknown tool {call.name!r}; available: {', '.join(sorted(tools))}", False
    try:
        if call.arguments is not None:
            text = chosen.call(call.arguments)
        else:
            text = chosen.call_text(call.raw_arguments or "")
    except BadArguments as error:
        return f"error: {error}", False
    except ToolError as error:
        if ran is not None:
            ran.append(call.name)
        if isinstance(error, ToolTimeout):
            raise
        if isinstance(error, ToolCrash) and crashes is not None:
            crashes.append(error.description)
        return f"error: {error}", False
    if ran is not None:
        ran.append(call.name)
    return text, True
