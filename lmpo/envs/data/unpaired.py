"""Unpaired preference examples for KTO (`prompt`, `completion`, `label`) from users' files:
TRL's unpaired preference format, one completion per row, `label` true (desirable) or false
(undesirable).

When `prompt` and `completion` are strings they are tokenized as they are, with eos appended to
the completion. Otherwise the row is a chat row, rendered with the tokenizer's chat template:
`prompt` is a list of messages or a string taken as one user message; `completion` is a
string, one assistant message, or a list ending with the assistant message. LLaMA-Factory's
layouts are read too, their label `kto_tag`: ShareGPT's `conversations` ending with the reply,
or Alpaca's `instruction`/`input`/`output` (see `formats`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

from lmpo.envs.data import chat, formats
from lmpo.envs.data.preferences import prompt_fields
from lmpo.envs.data.records import DataError, Record, short_repr, type_name
from lmpo.envs.data.report import LoadReport, Overlong, RowFormat, certainly_overlong, load_rows
from lmpo.envs.data.sft import prompt_messages, sharegpt_turns

FIELDS = ("prompt", "completion", "label")


@dataclass
class UnpairedExample:
    prompt_ids: list[int]
    completion_ids: list[int]  # ends with eos unless truncated
    desirable: bool


def load_unpaired(path: str | Path, tokenizer: PreTrainedTokenizerBase, *, max_length: int,
                  overlong: Overlong = "error", limit_name: str = "",
                  columns: dict[str, str] | None = None) -> tuple[list[UnpairedExample], LoadReport]:
    """Examples from `path` (see `read_records`). An example's length is its prompt plus its
    completion; "truncate" keeps the whole prompt and cuts the completion, and skips an example
    whose prompt leaves no room. KTO weighs desirable against undesirable examples, so a file
    must hold both kinds. `columns` reads other columns as `prompt`, `completion` and `label`
    ({"question": "prompt", "response": "completion", "thumbs_up": "label"})."""
    examples, report = load_rows(path, tokenizer, max_length, overlong, EXAMPLES, limit_name,
                                 formats.renaming(columns or {}))
    _require_both_kinds(examples, str(path))
    return examples, report


def _fields(shape: str) -> tuple[str, ...]:
    """The fields an example's length adds up: its prompt's and its reply's."""
    reply = () if shape.endswith("(ShareGPT)") else ("output",) if shape.endswith("(Alpaca)") else ("completion",)
    return (*prompt_fields(shape), *reply)


def _least_tokens(rec: Record, shape: str, max_length: int, tokenizer: PreTrainedTokenizerBase) -> int | None:
    return certainly_overlong(rec, _fields(shape), max_length, tokenizer)


def _length(example: UnpairedExample) -> int:
    return len(example.prompt_ids) + len(example.completion_ids)


def _truncate(example: UnpairedExample, max_length: int) -> UnpairedExample | None:
    """The whole prompt and as much of the completion as fits; None when no room is left."""
    room = max_length - len(example.prompt_ids)
    return UnpairedExample(example.prompt_ids, example.completion_ids[:room], example.desirable) if room >= 1 else None


def _shape(rec: Record) -> tuple[str, str]:
    if rec.get("prompt") is None and (rec.get("conversations") is not None or rec.get("instruction") is not None):
        _label(rec, "kto_tag")
        if rec.get("conversations") is not None:
            return "conversations/kto_tag (ShareGPT)", "conversations"
        return "instruction/output/kto_tag (Alpaca)", "instruction"
    for field, expected in zip(FIELDS, ("a string or messages", "a string or an assistant message", "true or false")):
        if rec.get(field) is None:
            prompt = formats.likely_column(rec, formats.PROMPT_LIKE) if rec.get("prompt") is None else None
            raise rec.missing(field, expected + formats.columns_hint({"prompt_field": prompt}))
    _label(rec, "label")
    if not isinstance(rec.get("prompt"), (str, list)):
        raise rec.error("prompt", "a string or a list of messages", type_name(rec.get("prompt")))
    if not isinstance(rec.get("completion"), (str, list, dict)):
        raise rec.error("completion", "a string, an assistant message or a list of messages",
                        type_name(rec.get("completion")))
    for field in FIELDS[:2]:
        if not isinstance(rec.get(field), str):
            return "prompt/completion/label (chat)", field
    return "prompt/completion/label", "prompt"


TEXT_LABELS = {"true": True, "false": False, "1": True, "0": False}
"""A label as a CSV or TSV file writes it (every value there is text), case aside."""


def _label(rec: Record, field: str) -> bool:
    value = rec.get(field)
    if value is None:
        raise rec.missing(field, "true (desirable) or false (undesirable)")
    if isinstance(value, str) and {".csv", ".tsv"} & set(Path(rec.path).suffixes):
        if value.strip().lower() in TEXT_LABELS:
            return TEXT_LABELS[value.strip().lower()]
        raise rec.error(field, "true or false (or 1 or 0) for desirable or undesirable", short_repr(value))
    if type(value) is int and value in (0, 1):  # a 0/1 column (Parquet, JSON), as a CSV file's "1"/"0"
        return bool(value)
    if not isinstance(value, bool):
        raise rec.error(field, "true (desirable) or false (undesirable), or 1 or 0",
                        short_repr(value) if isinstance(value, int) else type_name(value))
    return value


def _llama_factory_row(rec: Record, shape: str) -> tuple[list[dict], dict, str]:
    """(prompt messages, the reply, its field) of a row in LLaMA-Factory's KTO layouts: ShareGPT's
    conversation ends with the reply; Alpaca's reply is its `output`."""
    if shape.endswith("(ShareGPT)"):
        turns, written = sharegpt_turns(rec), rec.get("conversations")
        last = f"conversations[{len(written) - 1}]"
        if turns[-1]["role"] != "assistant":
            raise rec.error(f"{last}.from", "the reply, a 'gpt' turn, last", short_repr(written[-1].get("from")))
        return turns[:-1], turns[-1], last
    return formats.alpaca_prompt(rec), {"role": "assistant", "content": rec.require_str("output")}, "output"


def _tokenize(rec: Record, shape: str, tokenizer: PreTrainedTokenizerBase) -> UnpairedExample:
    eos = tokenizer.eos_token_id
    if eos is None:
        raise DataError(rec.path, "the tokenizer has no eos token")
    if shape == "prompt/completion/label":
        prompt_ids = chat.encode_start(tokenizer, rec.require_str("prompt"))
        completion = chat.encode(tokenizer, rec.require_str("completion")) + [eos]
    elif shape.endswith("(ShareGPT)") or shape.endswith("(Alpaca)"):
        prompt, reply, field = _llama_factory_row(rec, shape)
        prompt_ids, completion = chat.encode_reply(rec, field, tokenizer, prompt, reply)
        return UnpairedExample(prompt_ids, completion, _label(rec, "kto_tag"))
    else:
        prompt = prompt_messages(rec, "prompt")
        reply = chat.reply(rec, "completion", rec.get("completion"), prompt)
        prompt_ids, completion = chat.encode_reply(rec, "completion", tokenizer, prompt, reply)
    return UnpairedExample(prompt_ids, completion, _label(rec, "label"))


def _require_both_kinds(examples: list[UnpairedExample], path: str) -> None:
    desirable = sum(e.desirable for e in examples)
    if desirable in (0, len(examples)):
        kind, missing = ("desirable", "false (undesirable)") if desirable else ("undesirable", "true (desirable)")
        raise DataError(path, f"all {len(examples)} examples are {kind}; KTO weighs desirable against undesirable "
                              f"completions, so it needs rows with label {missing} too")


EXAMPLES = RowFormat(_shape, _least_tokens, _tokenize, _length, _truncate, lambda shape, example: _fields(shape))
