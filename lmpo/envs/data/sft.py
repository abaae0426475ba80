"""Supervised fine-tuning and continued pre-training examples from users' files.

Shapes, decided by the first row and required of every row:
  - `messages`: a list of {role, content}; loss on each assistant turn through its eos.
  - `prompt`/`completion` strings: tokenized as they are (no template); loss on the
    completion and an appended eos. `prompt`/`answer` (or the columns `load_sft` is told) too.
  - `prompt`/`completion (chat)`: either field holds messages (see `chat.reply`); rendered
    with the tokenizer's chat template, a string prompt being one user message.
  - `text`: documents for continued pre-training; every token carries loss, eos appended.
  - ShareGPT's `conversations` (from/value turns, an optional `system` column) and Alpaca's
    `instruction`/`input`/`output` (optional `system`, `history`): as `messages` (see `formats`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

from lmpo.envs.data import chat, formats
from lmpo.envs.data.records import DataError, Record, short_repr, type_name
from lmpo.envs.data.report import LoadReport, Overlong, RowFormat, certainly_overlong, load_rows


@dataclass
class TokenizedExample:
    input_ids: list[int]
    loss_mask: list[int]  # 1 on tokens that carry loss

    def __len__(self) -> int:
        return len(self.input_ids)


UNPAIRED_LABELS = ("label", "kto_tag")  # KTO's columns: a row that may be an example not to imitate


def load_sft(path: str | Path, tokenizer: PreTrainedTokenizerBase, *, max_length: int,
             overlong: Overlong = "error", limit_name: str = "", prompt_field: str = "prompt",
             answer_field: str = "answer") -> tuple[list[TokenizedExample], LoadReport]:
    """Tokenized examples from `path` (see `read_records`), and what was done to get them. A row
    with a `prompt_field` and an `answer_field` column and no `completion` (GSM8K's `question`
    and `answer`) is a prompt/completion row. A column named on the command line (not the
    default) is read in every row, before a `prompt` or `completion` column the row also has,
    and a row without it is an error."""
    def columns(rec: Record) -> Record:
        for label in UNPAIRED_LABELS:
            if isinstance(rec.get(label), bool):  # a class label (a number, a name) is only a column not read
                raise rec.error(label, "no desirable/undesirable label (SFT trains on every completion: give an "
                                       "unpaired-feedback file to lmpo train kto, or keep the rows to imitate and "
                                       "drop the column)", short_repr(rec.get(label)))
        for name, option, default in ((prompt_field, "prompt_field", "prompt"), (answer_field, "answer_field", "answer")):
            if name != default and rec.get(name) is None:
                raise rec.missing(name, f"the column --{option} names")
        renames = {prompt_field: "prompt"} if prompt_field != "prompt" else {}
        if answer_field != "answer" or (rec.get("completion") is None and rec.get(answer_field) is not None
                                        and rec.get(prompt_field) is not None):
            renames[answer_field] = "completion"
        return rec.renamed(renames) if renames else rec

    return load_rows(path, tokenizer, max_length, overlong, EXAMPLES, limit_name, columns)


def pack(examples: list[TokenizedExample], seq_len: int) -> list[TokenizedExample]:
    """Concatenates the examples (documents already end with eos) and cuts them into rows of
    `seq_len` tokens; the last row holds the remainder and may be shorter. Rows do not reset
    attention at document boundaries."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be at least 1, got {seq_len}")
    ids = [t for ex in examples for t in ex.input_ids]
    mask = [m for ex in examples for m in ex.loss_mask]
    return [TokenizedExample(ids[i:i + seq_len], mask[i:i + seq_len]) for i in range(0, len(ids), seq_len)]


DECIDING_FIELDS = {"messages": chat.MESSAGES, "conversations": chat.MESSAGES, "instruction": "a non-empty string",
                   "prompt": "a string or a list of messages", "completion": "a string or an assistant message",
                   "text": "a non-empty string"}
"""The fields that decide a row's shape, and what each holds."""


def sft_shape(rec: Record) -> tuple[str, str]:
    """(shape, the field that decided it) for one row."""
    if rec.get("messages") is not None:
        return "messages", "messages"
    if rec.get("conversations") is not None:
        return "conversations (ShareGPT)", "conversations"
    if formats.is_alpaca(rec):
        return "instruction/output (Alpaca)", "instruction"
    prompt, completion = rec.get("prompt"), rec.get("completion")
    if prompt is not None or completion is not None:
        for field, value in (("prompt", prompt), ("completion", completion)):
            if isinstance(value, (list, dict)):
                return "prompt/completion (chat)", field
        return "prompt/completion", "prompt" if prompt is not None else "completion"
    if rec.get("text") is not None:
        return "text", "text"
    nulls = [name for name in DECIDING_FIELDS if name in rec.fields]  # all null here, else a shape was found
    if len(nulls) == 1:  # `{"text": null}` has its field: "got fields none" read as if it had none
        raise rec.missing(nulls[0], DECIDING_FIELDS[nulls[0]])
    prompt_like = formats.likely_column(rec, formats.PROMPT_LIKE)
    answer_like = formats.likely_column(rec, ("answer", *formats.ANSWER_LIKE))
    name_them = (f"--prompt_field {prompt_like} --answer_field {answer_like} read this file's"
                 if prompt_like and answer_like else "--prompt_field and --answer_field name them")
    raise rec.error(None, "a 'messages', 'prompt'/'completion' or 'text' field (or ShareGPT's 'conversations', "
                          f"Alpaca's 'instruction'/'output', or a prompt and an answer column: {name_them})",
                    f"fields {rec.present()}" + (f" (null: {', '.join(nulls)})" if nulls else "") + rec.rows_inside())


def _tokenize(rec: Record, shape: str, tokenizer: PreTrainedTokenizerBase) -> TokenizedExample:
    eos = tokenizer.eos_token_id
    if eos is None:
        raise DataError(rec.path, "the tokenizer has no eos token")
    if shape == "messages":
        msgs = chat.conversation(rec, "messages", rec.get("messages"))
        return TokenizedExample(*chat.encode_conversation(rec, "messages", tokenizer, msgs))
    if shape == "conversations (ShareGPT)":
        msgs = chat.conversation(rec, "conversations", sharegpt_turns(rec))
        return TokenizedExample(*chat.encode_conversation(rec, "conversations", tokenizer, msgs))
    if shape == "instruction/output (Alpaca)":
        msgs = chat.conversation(rec, "instruction", formats.alpaca_conversation(rec))
        return TokenizedExample(*chat.encode_conversation(rec, "instruction", tokenizer, msgs))
    if shape == "text":
        ids = chat.encode_start(tokenizer, rec.require_str("text")) + [eos]
        return TokenizedExample(ids, [1] * len(ids))
    if shape == "prompt/completion":
        prompt_ids = chat.encode_start(tokenizer, rec.require_str("prompt"))
        completion_ids = chat.encode(tokenizer, rec.require_str("completion")) + [eos]
    else:
        prompt = prompt_messages(rec, "prompt")
        completion = rec.get("completion")
        if completion is None:
            raise rec.missing("completion", "the assistant reply")
        reply = chat.reply(rec, "completion", completion, prompt)
        prompt_ids, completion_ids = chat.encode_reply(rec, "completion", tokenizer, prompt, reply)
    return TokenizedExample(prompt_ids + completion_ids, [0] * len(prompt_ids) + [1] * len(completion_ids))


def sharegpt_turns(rec: Record) -> list[dict]:
    """A ShareGPT row's `conversations` after its `system` column; errors name its turns as written."""
    return formats.with_system(rec, chat.messages(rec, "conversations", rec.get("conversations")))


def prompt_messages(rec: Record, field: str) -> list[dict[str, str]]:
    """A chat prompt: a list of messages, or a string taken as one user message."""
    value = rec.get(field)
    if value is None:
        raise rec.missing(field, "a string or a list of messages")
    if isinstance(value, str):
        return [{"role": "user", "content": rec.require_str(field)}]
    if not isinstance(value, list):
        raise rec.error(field, "a string or a list of messages", type_name(value))
    return chat.messages(rec, field, value)


def _truncate(example: TokenizedExample, max_length: int) -> TokenizedExample | None:
    """The first `max_length` tokens, or None when no loss token is left."""
    cut = TokenizedExample(example.input_ids[:max_length], example.loss_mask[:max_length])
    return cut if any(cut.loss_mask) else None


SHAPE_FIELDS = {"messages": ("messages",), "conversations (ShareGPT)": ("conversations", "system"),
                "instruction/output (Alpaca)": ("instruction", "input", "output", "system", "history"), "text": ("text",)}
"""The fields each shape renders (others: `prompt` and `completion`); no other column counts toward a row's length."""


def _least_tokens(rec: Record, shape: str, max_length: int, tokenizer: PreTrainedTokenizerBase) -> int | None:
    return certainly_overlong(rec, SHAPE_FIELDS.get(shape, ("prompt", "completion")), max_length, tokenizer)


EXAMPLES = RowFormat(sft_shape, _least_tokens, _tokenize, len, _truncate,
                     lambda shape, example: SHAPE_FIELDS.get(shape, ("prompt", "completion")))
