"""Preference pairs (`prompt`, `chosen`, `rejected`) from users' files.

When all three fields are strings they are tokenized as they are, with eos appended to
each reply. Otherwise the row is a chat row, rendered with the tokenizer's chat template:
`prompt` is a list of messages or a string taken as one user message; `chosen` and
`rejected` are each a string, one assistant message, or a list ending with the assistant
message (either that message alone or the prompt's messages followed by it). In place of
`prompt`, ShareGPT's `conversations` or Alpaca's `instruction` (with `input`, `system`,
`history`) give it, as LLaMA-Factory's preference datasets do (see `formats`). Without any, two
conversations share it (TRL's implicit prompt, `_implicit_prompt`), or two texts begin with it
(Anthropic's hh-rlhf, `_implicit_text_prompt`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

from lmpo.envs.data import chat, formats
from lmpo.envs.data.records import DataError, Record, type_name
from lmpo.envs.data.report import LoadReport, Overlong, RowFormat, certainly_overlong, load_rows
from lmpo.envs.data.sft import prompt_messages, sharegpt_turns

FIELDS = ("prompt", "chosen", "rejected")
PROMPT_FIELDS = {"ShareGPT": ("conversations", "system"), "Alpaca": ("instruction", "input", "system", "history"),
                 "implicit prompt": (), "implicit text prompt": ()}
"""The fields that hold a prompt in LLaMA-Factory's layouts (see `formats`), none where each reply holds
it (TRL's implicit prompt); else `prompt`."""


def prompt_fields(shape: str) -> tuple[str, ...]:
    """The fields a row of `shape` renders into its prompt."""
    return PROMPT_FIELDS.get(shape.rpartition("(")[2].rstrip(")"), ("prompt",))


@dataclass
class PreferencePair:
    prompt_ids: list[int]
    chosen_ids: list[int]  # ends with eos unless truncated
    rejected_ids: list[int]


def load_preferences(path: str | Path, tokenizer: PreTrainedTokenizerBase, *, max_length: int,
                     overlong: Overlong = "error", limit_name: str = "",
                     columns: dict[str, str] | None = None) -> tuple[list[PreferencePair], LoadReport]:
    """Pairs from `path` (see `read_records`). A pair's length is its prompt plus its longer
    reply; "truncate" keeps the whole prompt and cuts both replies to fit, and skips a pair
    whose prompt leaves no room or whose cut replies become identical. `columns` reads other
    columns as `prompt`, `chosen` and `rejected` ({"question": "prompt", "response_j": "chosen",
    "response_k": "rejected"} for StackExchange's pairs)."""
    return load_rows(path, tokenizer, max_length, overlong, PAIRS, limit_name, formats.renaming(columns or {}))


def _least_tokens(rec: Record, shape: str, max_length: int, tokenizer: PreTrainedTokenizerBase) -> int | None:
    prompt = prompt_fields(shape)  # the prompt is in every reply's length
    least = certainly_overlong(rec, prompt, max_length, tokenizer)
    return least or max((certainly_overlong(rec, (*prompt, f), max_length, tokenizer) or 0) for f in FIELDS[1:]) or None


def _shape(rec: Record) -> tuple[str, str]:
    if rec.get("prompt") is None and rec.get("conversations") is not None:
        return _replies_present(rec, "conversations/chosen/rejected (ShareGPT)", "conversations")
    if rec.get("prompt") is None and rec.get("instruction") is not None:
        return _replies_present(rec, "instruction/chosen/rejected (Alpaca)", "instruction")
    if rec.get("prompt") is None and all(isinstance(rec.get(f), list) for f in FIELDS[1:]):
        return "chosen/rejected (implicit prompt)", "chosen"
    if rec.get("prompt") is None and all(isinstance(rec.get(f), str) for f in FIELDS[1:]):
        return "chosen/rejected (implicit text prompt)", "chosen"
    for field in FIELDS:
        if rec.get(field) is None:
            raise rec.missing(field, f"a string or messages{_likely_columns(rec)}")
    if not isinstance(rec.get("prompt"), (str, list)):  # a type error, not a shape mismatch with other rows
        raise rec.error("prompt", "a string or a list of messages", type_name(rec.get("prompt")))
    for field in FIELDS[1:]:
        if not isinstance(rec.get(field), (str, list, dict)):
            raise rec.error(field, "a string, an assistant message or a list of messages", type_name(rec.get(field)))
    for field in FIELDS:
        if not isinstance(rec.get(field), str):
            return "prompt/chosen/rejected (chat)", field
    return "prompt/chosen/rejected", "prompt"


def _likely_columns(rec: Record) -> str:
    """The options that would read this row's columns, for a row without `prompt`, `chosen` or
    `rejected`."""
    prompt = formats.likely_column(rec, formats.PROMPT_LIKE) if rec.get("prompt") is None else None
    replies = (None, None)
    if rec.get("chosen") is None and rec.get("rejected") is None:
        replies = next((pair for pair in formats.REPLY_PAIRS_LIKE if all(rec.get(c) is not None for c in pair)),
                       (None, None))
    return formats.columns_hint({"prompt_field": prompt, "chosen_field": replies[0], "rejected_field": replies[1]})


def _replies_present(rec: Record, shape: str, field: str) -> tuple[str, str]:
    for reply in FIELDS[1:]:
        if rec.get(reply) is None:
            raise rec.missing(reply, "a string or an assistant message")
    return shape, field


def _implicit_prompt(rec: Record) -> tuple[list[dict], dict, dict]:
    """TRL's preference rows without a prompt (its ultrafeedback and hh-rlhf datasets): `chosen`
    and `rejected` are whole conversations; the messages they share are the prompt, and each must
    then end with one assistant message, its reply."""
    chosen, rejected = (chat.messages(rec, f, rec.get(f)) for f in FIELDS[1:])
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    if shared == 0:
        raise rec.error("chosen", "a conversation that shares its prompt (its first messages) with 'rejected', "
                                  "or a 'prompt' field", "no message in common")
    for field, msgs in (("chosen", chosen), ("rejected", rejected)):
        if len(msgs) != shared + 1 or msgs[-1]["role"] != "assistant":
            raise rec.error(field, f"the {shared} messages shared with the other reply, then one assistant message",
                            f"{len(msgs) - shared} messages after them" if len(msgs) != shared + 1
                            else f"a last turn of role {msgs[-1]['role']!r}")
    return chosen[:shared], chosen[-1], rejected[-1]


def _implicit_text_prompt(rec: Record) -> tuple[str, str, str]:
    """Rows of two whole texts without a prompt (Anthropic's hh-rlhf: "\n\nHuman: ...\n\nAssistant:
    ..."): the text both begin with is the prompt, cut back to a word's start so that no word is
    split between prompt and reply, the space before the word going with the reply (as TRL's
    `extract_prompt` does). Where the cut falls inside the shared text does not change DPO's loss:
    the shared tokens' log-ratios are the same in both replies and cancel in the margin."""
    chosen, rejected = (rec.require_str(f) for f in FIELDS[1:])
    cut = 0
    while cut < min(len(chosen), len(rejected)) and chosen[cut] == rejected[cut]:
        cut += 1
    while cut > 0 and not chosen[cut - 1].isspace():
        cut -= 1
    if cut > 0 and chosen[cut - 1] == " ":
        cut -= 1
    if not chosen[:cut].strip():
        raise rec.error("chosen", "a text that begins with the same prompt as 'rejected', or a 'prompt' field",
                        "no words in common at the start")
    return chosen[:cut], chosen[cut:], rejected[cut:]


def _prompt(rec: Record, shape: str) -> list[dict]:
    if shape.endswith("(ShareGPT)"):
        return sharegpt_turns(rec)
    if shape.endswith("(Alpaca)"):
        return formats.alpaca_prompt(rec)
    return prompt_messages(rec, "prompt")


TEXT_SHAPES = ("prompt/chosen/rejected", "chosen/rejected (implicit text prompt)")
"""Pair shapes encoded as plain text (prompt, reply, eos); the others through the chat template."""


def _tokenize(rec: Record, shape: str, tokenizer: PreTrainedTokenizerBase) -> PreferencePair:
    eos = tokenizer.eos_token_id
    if eos is None:
        raise DataError(rec.path, "the tokenizer has no eos token")
    if shape in TEXT_SHAPES:
        prompt, *replies = _implicit_text_prompt(rec) if shape.endswith("text prompt)") else (
            rec.require_str(f) for f in FIELDS)
        prompt_ids = chat.encode_start(tokenizer, prompt)
        chosen, rejected = (chat.encode(tokenizer, reply) + [eos] for reply in replies)
    else:
        if shape == "chosen/rejected (implicit prompt)":
            prompt, chosen_turn, rejected_turn = _implicit_prompt(rec)
        else:
            prompt = _prompt(rec, shape)
            chosen_turn, rejected_turn = (chat.reply(rec, f, rec.get(f), prompt) for f in FIELDS[1:])
        prompt_ids, chosen = chat.encode_reply(rec, "chosen", tokenizer, prompt, chosen_turn)
        _, rejected = chat.encode_reply(rec, "rejected", tokenizer, prompt, rejected_turn, count_prompt=False)
    if chosen == rejected:
        unk = tokenizer.unk_token_id
        got = ("the same tokens: the texts differ, but the tokenizer cannot represent some of their characters "
               f"({tokenizer.unk_token!r} in both)" if unk is not None and unk in chosen
               and rec.get("chosen") != rec.get("rejected") else "the same reply")
        raise rec.error("rejected", "a reply different from 'chosen'", got)
    return PreferencePair(prompt_ids, chosen, rejected)


def _length(pair: PreferencePair) -> int:
    return len(pair.prompt_ids) + max(len(pair.chosen_ids), len(pair.rejected_ids))


def _truncate(pair: PreferencePair, max_length: int) -> PreferencePair | None:
    room = max_length - len(pair.prompt_ids)
    if room < 1 or pair.chosen_ids[:room] == pair.rejected_ids[:room]:
        return None
    return PreferencePair(pair.prompt_ids, pair.chosen_ids[:room], pair.rejected_ids[:room])


def _fields(shape: str, pair: PreferencePair) -> tuple[str, ...]:
    """The fields a pair's length adds up: the prompt's and the longer reply's."""
    return (*prompt_fields(shape), "chosen" if len(pair.chosen_ids) >= len(pair.rejected_ids) else "rejected")


PAIRS = RowFormat(_shape, _least_tokens, _tokenize, _length, _truncate, _fields)
