"""Prompt sets for RL, with every extra column kept for reward functions."""

from __future__ import annotations

import math
from pathlib import Path

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

from lmpo.envs.base import Problem
from lmpo.envs.data import chat, formats
from lmpo.envs.data.records import DataError, LoadProgress, Record, ShapeCheck, read_records, short_repr, type_name
from lmpo.envs.data.report import certainly_overlong
from lmpo.envs.data.unknown import Unknown, counting_unknown, unknown_for


def load_prompts(path: str | Path, *, prompt_field: str = "prompt", answer_field: str = "answer",
                 tokenizer: PreTrainedTokenizerBase | None = None, require_answer: bool = False,
                 max_prompt_tokens: int | None = None, context: str = "",
                 unknown: dict[str, Unknown] | None = None) -> list[Problem]:
    """Problems from `path` (see `read_records`). The prompt field is a string, used as it
    is, or a list of messages rendered with `tokenizer`'s chat template and its generation
    prompt (all rows alike), the messages kept in `Problem.messages` (and the row's `tools` in
    `Problem.tools`) for a chat reward model to render as it was trained. `answer` is the answer
    field as a string (a number is written out, `42.0` as `42`; absent, null or NaN gives "", or an error with `require_answer`). Every other column
    goes to `Problem.meta`. With `max_prompt_tokens` (and a tokenizer), a longer prompt is an
    error naming its row (`context` says where the limit comes from). With `unknown` (and a
    tokenizer), the tokenizer's unknown tokens in the prompts are counted into its key
    "prompt", and with `require_answer` those in the answers (text a completion can never
    match) into "answer"."""
    records = read_records(path)
    if not records:
        raise DataError(path, "no rows")
    shapes = ShapeCheck()
    problems = []
    counts = unknown if unknown is not None and tokenizer is not None else None
    if counts is not None:
        counts.setdefault("prompt", unknown_for(tokenizer))
        counts.setdefault("answer", unknown_for(tokenizer))
    progress = LoadProgress(str(path), "checking prompts" if tokenizer is not None else "reading prompts",
                            len(records), "rows")
    for done, rec in enumerate(records):
        if done % 1024 == 0:
            progress.update(done)
        if max_prompt_tokens is not None and tokenizer is not None:
            least = certainly_overlong(rec, (prompt_field,), max_prompt_tokens, tokenizer)
            if least is not None:  # before rendering and tokenizing a huge row
                raise rec.error(prompt_field, f"a prompt of at most {max_prompt_tokens} tokens{context}",
                                f"at least {least} tokens")
        prompt, msgs = _prompt(rec, prompt_field, tokenizer, shapes)
        if tokenizer is not None:
            n = len(chat.starting(tokenizer, _encode_counting(tokenizer, prompt, counts and counts["prompt"], rec)))
            if n == 0:  # found here, not when the shuffled stream reaches the row mid-run
                raise rec.error(prompt_field, "a prompt of at least one token", f"{short_repr(prompt)}, which the "
                                "tokenizer turns into no tokens")
            if max_prompt_tokens is not None and n > max_prompt_tokens:
                raise rec.error(prompt_field, f"a prompt of at most {max_prompt_tokens} tokens{context}", f"{n} tokens")
        if require_answer:
            _required_answer(rec, answer_field)
            if counts is not None:
                _encode_counting(tokenizer, _answer(rec, answer_field), counts["answer"], rec)
        meta = {k: v for k, v in rec.fields.items() if k not in (prompt_field, answer_field)}
        problems.append(Problem(prompt, _answer(rec, answer_field), meta, messages=msgs,
                                tools=chat.row_tools(rec) if msgs else None))
    return problems


def _encode_counting(tokenizer, text: str, unknown: Unknown | None, rec: Record) -> list[int]:
    if unknown is None:
        return chat.encode(tokenizer, text)
    before = unknown.tokens
    with counting_unknown(tokenizer, unknown):
        ids = chat.encode(tokenizer, text)
    unknown.row(rec.place, before)
    return ids


def _prompt(rec: Record, field: str, tokenizer: PreTrainedTokenizerBase | None,
            shapes: ShapeCheck) -> tuple[str, list[dict] | None]:
    """The prompt's text, and its messages when the row gives a list of them (None for a text)."""
    value = rec.get(field)
    if isinstance(value, list):
        shapes.check(rec, "messages", field)
        if tokenizer is None:
            raise rec.error(field, "a string (a list of messages needs tokenizer= with a chat template)",
                            "a list of messages")
        if not chat.has_chat_template(tokenizer):
            raise chat.no_template(rec, field)
        msgs = chat.messages(rec, field, value)
        if msgs[-1]["role"] == "assistant":  # SFT conversations reused as prompts: the model would answer after it
            key = "from" if formats.is_sharegpt_turn(value[-1]) else "role"
            raise rec.error(f"{field}[{len(msgs) - 1}].{key}", "a prompt that ends with a turn for the model to answer "
                                                             "(user, tool or system)",
                            "'assistant' (a reply: drop it from the prompt, or make it the row's answer)")
        text = chat.render(rec, field, tokenizer, msgs, generation_prompt=True)
        chat.check_messages_rendered(rec, field, tokenizer, msgs, text, generation_prompt=True)
        return text, msgs
    if value is None:
        hint = ""
        if field == "prompt":
            likely = formats.likely_column(rec, formats.PROMPT_LIKE)
            hint = (f" (--prompt_field {likely} reads the row's {likely!r} column)" if likely else
                    " (prompt_field, --prompt_field on the command line, names another column)")
        raise rec.missing(field, f"a string or a list of messages{hint}")
    if not isinstance(value, str):
        raise rec.error(field, "a string or a list of messages", type_name(value))
    shapes.check(rec, "text", field)
    return rec.require_str(field), None


def _answer(rec: Record, field: str) -> str:
    value = _answer_value(rec, field)
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise rec.error(field, "a string or a number", type_name(value))
    if isinstance(value, float) and value.is_integer():  # 42.0: a whole number in a float column
        return str(int(value))
    return repr(value)  # the shortest text that reads back as the same number: 2.5, 1e-05


def _answer_value(rec: Record, field: str):
    """The answer column's value; NaN, how a numeric column of Parquet or pandas writes a missing
    value, is None."""
    value = rec.get(field)
    return None if isinstance(value, float) and math.isnan(value) else value


def _required_answer(rec: Record, field: str) -> None:
    expected = "the answer the grader compares completions with (task exact_match)"
    value = _answer_value(rec, field)
    if value is None and rec.get(field) is not None:
        raise rec.error(field, expected, "NaN (a missing value in a numeric column)")
    if value is None:
        hint = ""
        if field == "answer":
            likely = formats.likely_column(rec, formats.ANSWER_LIKE)
            hint = (f"; --answer_field {likely} reads the row's {likely!r} column" if likely else
                    "; answer_field, --answer_field on the command line, names another column")
        raise rec.missing(field, expected[:-1] + hint + ")")
    if isinstance(value, str) and not value.strip():
        raise rec.error(field, expected, "an empty string")
