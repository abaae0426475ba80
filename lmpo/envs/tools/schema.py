"""Tools a model can call: a typed Python function plus the JSON schema a chat template shows
the model, and strict checking of the arguments the model wrote before the function runs."""

from __future__ import annotations

import ast
import inspect
import json
import re
import types
import typing
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Union


def quiet_parse(source: str) -> ast.Expression:
    """`ast.parse(source, mode="eval")` without the SyntaxWarnings Python prints for model-written
    junk such as `12a` (the SyntaxError that follows is what callers report)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        return ast.parse(source, mode="eval")


class ToolError(Exception):
    """A tool call the tool refuses (bad arguments, unknown key...). Its message goes back to
    the model as an observation; it never crashes the episode."""


class BadArguments(ToolError):
    """The call's arguments do not fit the tool's parameters: refused before the tool's function
    ran, so the call does not count as one that reached the tool."""


class ToolTimeout(ToolError):
    """The tool overran its own time limit (the sandbox's wall clock, the SQL deadline, a
    network timeout): the tool's infrastructure failed, not the model's call, so the episode
    ends as `tool_timeout` and is excluded from training. A tool whose function raises Python's
    TimeoutError gets this too."""


class ToolCrash(ToolError):
    """A tool's function raised something other than ToolError. The model sees the error as it
    would a refusal, but it may be a bug in the tool rather than the model's bad input, so the
    environment also reports it to the person running training (`description`)."""

    def __init__(self, tool_name: str, error: BaseException):
        super().__init__(f"{type(error).__name__}: {error}")
        self.description = f"{tool_name} raised {type(error).__name__}: {error} ({_raised_at(error)})"


def _raised_at(error: BaseException) -> str:
    """`file:line` where the exception was raised: the innermost frame of its traceback."""
    frame = error.__traceback__
    if frame is None:
        return "no traceback"
    while frame.tb_next is not None:
        frame = frame.tb_next
    return f"{frame.tb_frame.f_code.co_filename}:{frame.tb_lineno}"


def clip(text: str, max_chars: int) -> str:
    """`text` cut to `max_chars` characters, with a visible marker saying how much was cut; whole
    when the marker would be no shorter than what it replaces."""
    marker = f"…[clipped {len(text) - max_chars} chars]"
    if len(text) - max_chars <= len(marker):
        return text
    return text[:max_chars] + marker


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[..., Any]
    description: str
    """First paragraph of the function's docstring."""
    parameters: dict
    """JSON schema: {"type": "object", "properties": {...}, "required": [...]}."""

    def schema(self) -> dict:
        """The shape transformers' ``apply_chat_template(tools=[...])`` accepts."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    def call(self, arguments: dict) -> str:
        """Check `arguments` against the parameters, call the function, return its result as text
        (a dict or list as JSON, anything else as ``str``).

        Unknown or missing arguments and wrong JSON types raise BadArguments naming the argument
        and what was expected (an int is accepted for a float; a numeric string is not
        converted). A TimeoutError from the function becomes ToolTimeout; any other exception
        becomes ``ToolCrash("Type: message")``.
        """
        if not isinstance(arguments, dict):
            raise BadArguments(f"{self.name}: arguments must be a JSON object, got {_describe_value(arguments)}")
        properties: dict = self.parameters.get("properties", {})
        unknown = [key for key in arguments if key not in properties]
        if unknown:
            expected = ", ".join(properties) or "no arguments"
            raise BadArguments(f"{self.name}: unknown argument {unknown[0]!r}; expected: {expected}")
        for name in self.parameters.get("required", []):
            if name not in arguments:
                raise BadArguments(f"{self.name}: missing required argument {name!r} ({_describe(properties[name])})")
        checked = {key: _validate(value, properties[key], f"{self.name}: argument {key!r}")
                   for key, value in arguments.items()}
        try:
            result = self.fn(**checked)
        except ToolError:
            raise
        except TimeoutError as error:  # socket, urllib, concurrent.futures: the tool's own deadline passed
            raise ToolTimeout(f"timeout: {type(error).__name__}: {error} ({_raised_at(error)})") from error
        except Exception as error:  # the model's input broke the tool, or the tool is broken: tell both
            raise ToolCrash(self.name, error) from error
        return as_text(result)

    def call_text(self, text: str) -> str:
        """Call from the compact format's raw text between the parentheses.

        With exactly one required string parameter the whole text is that argument
        (``calculator(3*(4+5))``); otherwise the text must be Python arguments with literal
        values only (``a=1, b="x"``; positional ones fill the parameters in order).
        """
        properties: dict = self.parameters.get("properties", {})
        required = self.parameters.get("required", [])
        if len(required) == 1 and properties[required[0]].get("type") == "string":
            return self.call({required[0]: text})
        return self.call(_literal_arguments(self.name, text, list(properties)))


def as_text(result: Any) -> str:
    """A tool's return value as the model reads it: a string unchanged, a dict, list or tuple as
    JSON (what chat templates' tool results look like; Python's repr would show `'` quotes and
    `True`), anything else as ``str``."""
    if isinstance(result, str):
        return result
    if isinstance(result, (dict, list, tuple)):
        try:
            return json.dumps(result, ensure_ascii=False)
        except (TypeError, ValueError):
            return str(result)  # e.g. a dict with a datetime value: its repr is still readable
    return str(result)


def _literal_arguments(tool_name: str, text: str, names: list[str]) -> dict:
    if not text.strip():
        return {}
    try:
        node = quiet_parse(f"_({text})").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise BadArguments(f"{tool_name}: cannot parse the arguments {clip(text, 80)!r} "
                        f"(expected literals like a=1, b=\"x\"): {error}") from None
    # `_(1), g(2)` parses as a tuple, not a call: the text left its parentheses
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.func.id != "_":
        raise BadArguments(f"{tool_name}: cannot parse the arguments {clip(text, 80)!r}")
    if len(node.args) > len(names):
        raise BadArguments(f"{tool_name}: takes {len(names)} argument(s), got {len(node.args)}")
    arguments: dict = {}
    pairs = [(names[i], arg) for i, arg in enumerate(node.args)] + [(kw.arg, kw.value) for kw in node.keywords]
    for name, value in pairs:
        if name is None or isinstance(value, ast.Starred):
            raise BadArguments(f"{tool_name}: * and ** are not allowed in arguments")
        if name in arguments:
            raise BadArguments(f"{tool_name}: argument {name!r} given twice")
        try:
            arguments[name] = _jsonable(ast.literal_eval(value))
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            raise BadArguments(f"{tool_name}: argument {name!r} must be a literal value "
                            f"(number, string, True/False/None, list), got {clip(ast.unparse(value), 80)!r}") from None
    return arguments


def _jsonable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    return value


def tool(fn: Callable | None = None, *, name: str | None = None) -> Tool | Callable[[Callable], Tool]:
    """Build a Tool from a typed function; usable as ``@tool``, ``@tool(name=...)`` and ``tool(fn)``.

    JSON types come from the annotations (str, int, float, bool, list[...], dict, Optional /
    ``X | None``, Literal[...] as an enum); parameter descriptions from a Google-style
    ``Args:`` section of the docstring. A parameter without annotation, or an ``async def``
    function, raises TypeError.
    """
    if fn is None:
        return lambda f: _build(f, name)
    return _build(fn, name)


def _build(fn: Callable, name: str | None) -> Tool:
    tool_name = name or fn.__name__
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        # called, it returns a coroutine the episode would show the model as `<coroutine object ...>`
        raise TypeError(f"tool {tool_name!r} is an async function; tools must be plain (synchronous) functions "
                        "that return their result (run a coroutine to completion inside one, e.g. asyncio.run)")
    try:
        hints = typing.get_type_hints(fn)
    except Exception as error:
        raise TypeError(f"tool {tool_name!r}: cannot resolve the annotations: {error}") from error
    description, arg_docs = _parse_docstring(inspect.getdoc(fn) or "")
    properties: dict[str, dict] = {}
    required: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        where = f"tool {tool_name!r}, parameter {param.name!r}"
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise TypeError(f"{where}: only named parameters can be tool arguments (no *args, **kwargs, positional-only)")
        if param.name not in hints:
            raise TypeError(f"{where} has no type annotation; tools need one per parameter")
        schema = _json_schema(hints[param.name], where)
        if param.name in arg_docs:
            schema["description"] = arg_docs[param.name]
        properties[param.name] = schema
        if param.default is param.empty:
            required.append(param.name)
    return Tool(name=tool_name, fn=fn, description=description,
                parameters={"type": "object", "properties": properties, "required": required})


_SIMPLE = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _json_schema(hint: Any, where: str) -> dict:
    if hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}
    if hint is Any:
        return {}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is list or origin is list:
        return {"type": "array", "items": _json_schema(args[0], where)} if args else {"type": "array"}
    if hint is dict or origin is dict:
        if len(args) == 2 and args[0] is not str:
            raise TypeError(f"{where}: JSON object keys are strings, not {args[0]!r}")
        return {"type": "object", "additionalProperties": _json_schema(args[1], where)} if args else {"type": "object"}
    if origin is Literal:
        kinds = {_JSON_TYPE.get(type(value)) for value in args}
        if None in kinds:
            raise TypeError(f"{where}: Literal values must be str, int, float or bool, got {args!r}")
        return {"type": kinds.pop() if len(kinds) == 1 else sorted(kinds), "enum": list(args)}
    if origin in (Union, types.UnionType):
        options = [arg for arg in args if arg is not type(None)]
        schema = _json_schema(options[0], where) if len(options) == 1 else {
            "anyOf": [_json_schema(option, where) for option in options]}
        return {**schema, "nullable": True} if len(options) < len(args) else schema
    raise TypeError(f"{where}: unsupported annotation {hint!r}; use str, int, float, bool, list[...], dict, "
                    "Literal[...] or Optional[...]")


_JSON_TYPE = {type(None): "null", bool: "boolean", int: "integer", float: "number", str: "string",
              list: "array", dict: "object"}


def _describe(schema: dict) -> str:
    if "enum" in schema:
        text = "one of " + ", ".join(map(repr, schema["enum"]))
    elif "anyOf" in schema:
        text = " or ".join(_describe(option) for option in schema["anyOf"])
    elif isinstance(schema.get("type"), list):
        text = " or ".join(schema["type"])
    elif schema.get("type") == "array" and "items" in schema:
        text = f"an array of {_describe(schema['items'])}"
    elif "type" in schema:
        text = {"integer": "an integer", "array": "an array", "object": "an object"}.get(schema["type"],
                                                                                        f"a {schema['type']}")
    else:
        text = "any value"
    return f"{text} or null" if schema.get("nullable") else text


def _describe_value(value: Any) -> str:
    kind = _JSON_TYPE.get(type(value), type(value).__name__)
    return kind if value is None else f"{kind} {clip(repr(value), 60)}"


def _validate(value: Any, schema: dict, where: str) -> Any:
    """`value` if it fits `schema` (ints widened to float for a number); else ToolError."""
    if value is None and schema.get("nullable"):
        return None
    if "anyOf" in schema:
        for option in schema["anyOf"]:
            try:
                return _validate(value, option, where)
            except ToolError:
                pass
    elif "enum" in schema:
        # `True == 1`: compare types too, so a bool never matches an int option
        if any(type(value) is type(option) and value == option for option in schema["enum"]):
            return value
    else:
        kind = schema.get("type")
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind is None or (kind == "string" and isinstance(value, str)) or (kind == "boolean" and isinstance(value, bool)):
            return value
        if kind == "integer" and is_number and isinstance(value, int):
            return value
        if kind == "number" and is_number:
            return float(value)
        if kind == "array" and isinstance(value, list):
            items = schema.get("items", {})
            return [_validate(item, items, f"{where}[{i}]") for i, item in enumerate(value)]
        if kind == "object" and isinstance(value, dict):
            inner = schema.get("additionalProperties", {})
            return {key: _validate(item, inner, f"{where}[{key!r}]") for key, item in value.items()}
    raise BadArguments(f"{where} must be {_describe(schema)}, got {_describe_value(value)}")


_SECTION = re.compile(r"^(\w[\w ]*):\s*$")
_ARG_LINE = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(first paragraph, {parameter: description}) from a Google-style docstring."""
    lines = doc.splitlines()
    paragraph: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION.match(line.strip()):
            break
        paragraph.append(line.strip())
    descriptions: dict[str, str] = {}
    in_args, current = False, None
    for line in lines:
        indent, stripped = len(line) - len(line.lstrip()), line.strip()
        if indent == 0 and stripped:
            in_args = stripped in ("Args:", "Arguments:", "Parameters:")
            current = None
            continue
        if not in_args or not stripped:
            continue
        match = _ARG_LINE.match(stripped)
        if match and (current is None or indent <= current[1]):
            current = (match[1], indent)
            descriptions[match[1]] = match[2]
        elif current is not None:
            descriptions[current[0]] = f"{descriptions[current[0]]} {stripped}".strip()
    return " ".join(paragraph), descriptions
