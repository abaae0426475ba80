"""Prompt sets for RL, with every extra column kept for reward functions."""

from __future__ import annotations

from pathlib import Path

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

from lmpo.envs.base import Problem
from lmpo.envs.data import chat
from lmpo.envs.data.records import DataError, Record, ShapeCheck, read_records, type_name


def load_prompts(path: str | Path, *, prompt_field: str = "prompt", answer_field: str = "answer",
                 tokenizer: PreTrainedTokenizerBase | None = None) -> list[Problem]:
    """Problems from `path` (see `read_records`). The prompt field is a string, used as it
    is, or a list of messages rendered with `tokenizer`'s chat template and its generation
    prompt (all rows alike). `answer` is the answer field as a string (an integer is
    converted; absent or null gives ""). Every other column goes to `Problem.meta`."""
    records = read_records(path)
    if not records:
        raise DataError(path, "no rows")
    shapes = ShapeCheck()
    problems = []
    for rec in records:
        prompt = _prompt(rec, prompt_field, tokenizer, shapes)
        meta = {k: v for k, v in rec.fields.items() if k not in (prompt_field, answer_field)}
        problems.append(Problem(prompt, _answer(rec, answer_field), meta))
    return problems


def _prompt(rec: Record, field: str, tokenizer: PreTrainedTokenizerBase | None, shapes: ShapeCheck) -> str:
    value = rec.get(field)
    if isinstance(value, list):
        shapes.check(rec, "messages", field)
        if not chat.has_chat_template(tokenizer):
            raise rec.error(field, "a string (a list of messages needs tokenizer= with a chat template)",
                            "a list of messages")
        return chat.render(rec, field, tokenizer, chat.messages(rec, field, value), generation_prompt=True)
    if value is None:
        hint = " (pass prompt_field= to use another column)" if field == "prompt" else ""
        raise rec.missing(field, f"a string or a list of messages{hint}")
    if not isinstance(value, str):
        raise rec.error(field, "a string or a list of messages", type_name(value))
    shapes.check(rec, "text", field)
    return rec.require_str(field)


def _answer(rec: Record, field: str) -> str:
    value = rec.get(field)
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise rec.error(field, "a string or an integer", type_name(value))
