"""Conversations in the layouts other fine-tuning tools read, as lmpo's messages: ShareGPT's
turns (`{"from": "human", "value": ...}`, in a `conversations` or `messages` column) and
Alpaca's rows (`instruction`, `input`, `output`, with an optional `system` and `history`; a
preference pair's prompt without `output`), the
two formats of LLaMA-Factory's datasets and of many public ones. Both are rendered with the
tokenizer's chat template, as there; every error names the row and the field as written."""

from __future__ import annotations

import json
from typing import Any

from lmpo.envs.data.records import Record, short_repr, type_name

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "observation": "tool", "tool": "tool", "function_call": "assistant"}
"""ShareGPT's `from` values, LLaMA-Factory's tool turns among them: `function_call` (the model's
call, its value the JSON of {"name", "arguments"}, or a list of them) and `observation` (the
tool's output)."""


def is_sharegpt_turn(value: Any) -> bool:
    return isinstance(value, dict) and value.get("role") is None and value.get("from") is not None


def sharegpt_turn(rec: Record, where: str, value: dict) -> dict[str, Any]:
    """One ShareGPT turn as a {role, content} message (not yet validated: `chat.message` does that)."""
    speaker = value.get("from")
    role = SHAREGPT_ROLES.get(speaker) if isinstance(speaker, str) else None
    if role is None:
        raise rec.error(f"{where}.from", f"one of {', '.join(map(repr, SHAREGPT_ROLES))}", short_repr(speaker))
    text = value.get("value")
    if speaker != "function_call":
        if not isinstance(text, str) or (role == "assistant" and not text):
            raise rec.error(f"{where}.value", "a non-empty string" if role == "assistant" else "a string",
                            type_name(text) if text != "" else "''")
        return {"role": role, "content": text}
    try:
        calls = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        calls = None
    if not isinstance(calls, (dict, list)):
        raise rec.error(f"{where}.value", 'the JSON of a call, {"name": ..., "arguments": {...}} (or a list of them)',
                        short_repr(text))
    return {"role": "assistant", "content": None, "tool_calls": calls if isinstance(calls, list) else [calls]}


def with_system(rec: Record, turns: list) -> list:
    """The row's `system` column, where it has one, as the conversation's first turn."""
    system = rec.get("system")
    if system is None or system == "":
        return turns
    if not isinstance(system, str):
        raise rec.error("system", "a string", type_name(system))
    return [{"role": "system", "content": system}, *turns]


def is_alpaca(rec: Record) -> bool:
    return rec.get("instruction") is not None and rec.get("output") is not None


def alpaca_conversation(rec: Record) -> list[dict[str, Any]]:
    """An Alpaca row as messages: `alpaca_prompt`, then `output` as the assistant's turn."""
    return [*alpaca_prompt(rec), {"role": "assistant", "content": rec.require_str("output")}]


def alpaca_prompt(rec: Record) -> list[dict[str, Any]]:
    """An Alpaca row's prompt as messages: `system`; each `history` pair ([query, response]) as a
    user and an assistant turn; then `instruction` and `input` joined by a newline (as
    LLaMA-Factory joins them) as the user turn."""
    turns: list[dict[str, Any]] = []
    history = rec.get("history")
    if history is not None:
        if not isinstance(history, list):
            raise rec.error("history", "a list of [query, response] pairs", type_name(history))
        for i, pair in enumerate(history):
            if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(t, str) and t for t in pair)):
                raise rec.error(f"history[{i}]", "a [query, response] pair of non-empty strings", short_repr(pair))
            turns += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    instruction, extra = rec.require_str("instruction"), rec.get("input")
    if extra is not None and not isinstance(extra, str):
        raise rec.error("input", "a string", type_name(extra))
    turns.append({"role": "user", "content": f"{instruction}\n{extra}" if extra else instruction})
    return with_system(rec, turns)



PROMPT_LIKE = ("question", "problem", "query", "instruction", "input")
ANSWER_LIKE = ("solution", "ground_truth", "final_answer", "target", "output", "label")
"""Columns that public datasets give their prompts and answers (GSM8K's question, MATH's problem
and solution), suggested when the expected column is missing."""


REPLY_PAIRS_LIKE = (("response_j", "response_k"), ("chosen_response", "rejected_response"), ("preferred", "rejected"),
                    ("better", "worse"), ("winner", "loser"), ("accepted", "rejected"))
"""Columns that public pair datasets give their preferred and other reply (StackExchange's
response_j/response_k, j the preferred), suggested when `chosen`/`rejected` are missing."""


def columns_hint(wanted: dict[str, str | None]) -> str:
    """` (--prompt_field question --chosen_field response_j read the row's 'question' and
    'response_j' columns)` for the options whose column the row seems to hold ({option: column}),
    else ""."""
    found = {option: column for option, column in wanted.items() if column}
    if not found:
        return ""
    flags = " ".join(f"--{option} {column}" for option, column in found.items())
    names = [repr(column) for column in found.values()]
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return f" ({flags} read{'s' * (len(names) == 1)} the row's {listed} column{'s' * (len(names) > 1)})"


def renaming(columns: dict[str, str]):
    """A row reader that takes the file's columns under lmpo's names ({file column: lmpo's name},
    as the --*_field options give them); identity where nothing is renamed."""
    columns = {column: name for column, name in columns.items() if column != name}
    return (lambda rec: rec.renamed(columns)) if columns else None


def likely_column(rec: Record, names: tuple[str, ...]) -> str | None:
    """The first of `names` the row has a value for."""
    return next((name for name in names if rec.get(name) is not None), None)
