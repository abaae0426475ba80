"""Text a tokenizer cannot represent: the characters it turns into its unknown token.

A byte-level tokenizer (GPT-2's, Qwen's, Llama 3's) represents any text. A tokenizer with a
fixed alphabet or word list, such as the embedded model's, maps whatever is outside it to one
token, `<unk>`: a model trained on such text never sees those characters, and can never write
them. Loaders count these tokens, and their summaries name the characters and the first row."""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

SHOWN_CHARACTERS = 8


@dataclass
class Unknown:
    """`<unk>` tokens among `total` tokens of some texts, in `rows` rows (the first at `first`,
    e.g. "row 3"), and the characters they stood for, counted."""

    unk_token: str = "<unk>"
    unk_id: int | None = None
    tokens: int = 0
    total: int = 0
    rows: int = 0
    first: str = ""
    chars: Counter = field(default_factory=Counter)

    def note(self, tokenizer, text: str, ids: list[int], encoding=None, skip: int = 0) -> int:
        """Count the unknown tokens of `ids[skip:]`, `ids` being the tokens of `text` (`encoding`:
        the fast backend's `Encoding` of it, whose offsets say which characters each token stands
        for, where the caller has it): how many there were. A literal `<unk>` written in the text
        is the token itself, not an unknown character, and is not counted."""
        self.total += max(len(ids) - skip, 0)
        unk = self.unk_id
        if unk is None or unk not in ids[skip:]:
            return 0
        offsets = encoding.offsets if encoding is not None else None
        if offsets is None and getattr(tokenizer, "is_fast", False):
            encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            if list(encoded.input_ids) == list(ids):
                offsets = encoded.offset_mapping
        found = 0
        for i, token in enumerate(ids):
            if token != unk or i < skip:
                continue
            if offsets is not None:
                start, end = offsets[i]
                if text[start:end] == self.unk_token:
                    continue
                self.chars[text[start:end]] += 1
            found += 1
        self.tokens += found
        return found

    def row(self, where: str, before: int) -> None:
        """A row is done: count it if it added unknown tokens since `before` (`tokens` then)."""
        if self.tokens > before:
            self.rows += 1
            self.first = self.first or where

    def summary(self) -> str:
        """"" when there were none; else what they were and where the first was."""
        if not self.tokens:
            return ""
        share = self.tokens / max(self.total, 1)
        shown = ", ".join(f"{c!r} x{n}" for c, n in self.chars.most_common(SHOWN_CHARACTERS))
        more = len(self.chars) - SHOWN_CHARACTERS
        chars = f" ({shown}{f' and {more} more' if more > 0 else ''})" if shown else ""
        rows = f"{self.rows} row{'s' if self.rows != 1 else ''}"
        return (f"{self.tokens} of {self.total} tokens ({share:.1%}), in {rows}, are {self.unk_token}: text the "
                f"tokenizer cannot represent{chars} (first at {self.first})")


def unknown_for(tokenizer) -> Unknown:
    """An empty count for `tokenizer`'s unknown token (one it has no unknown token for counts nothing)."""
    return Unknown(unk_token=str(getattr(tokenizer, "unk_token", None) or "<unk>"),
                   unk_id=getattr(tokenizer, "unk_token_id", None))


@contextmanager
def counting_unknown(tokenizer, unknown: Unknown | None = None) -> Iterator[Unknown]:
    """While open, `lmpo.envs.data.chat.encode` counts the unknown tokens it produces with
    `tokenizer` into `unknown` (a new `Unknown` if None), which this yields."""
    if unknown is None:
        unknown = unknown_for(tokenizer)
    before = getattr(tokenizer, "_lmpo_unknown", None)
    try:
        tokenizer._lmpo_unknown = unknown
    except AttributeError:  # a tokenizer that takes no attributes: nothing is counted
        pass
    try:
        yield unknown
    finally:
        try:
            tokenizer._lmpo_unknown = before
        except AttributeError:
            pass
