"""A very long text (one 5 MB line of a corpus) encoded in pieces, so that memory follows the
ids kept rather than the tokenizer's working state: a fast tokenizer's encoding of one text holds
its tokens as strings, their offsets and masks, ~370 bytes a token (1.8 GB for 5M tokens), where
the ids kept are a few bytes each.

The text is cut before a single space that sits between two non-space characters, the piece
after the cut starting with that space. A tokenizer that splits words apart before its model
(GPT-2's, Llama 3's and Qwen's byte-level pre-tokenizers; the embedded character tokenizer)
makes the same ids from the pieces as from the whole; one that does not (SentencePiece's
Llama 2 tokenizer, whose normalizer puts `▁` before every text it is given) would not. So the
pieces are used only where both checks agree, else the text is encoded whole as before:

  - once per tokenizer, a probe of words, digits, punctuation, newlines and runs of spaces,
    cut at every such space, must give the ids of the probe encoded whole;
  - for each long text, its first two pieces encoded as one text must give the ids of the
    pieces, one after the other.
"""

from __future__ import annotations

import re
from typing import Callable

LONG_TEXT_CHARS = 100_000
"""Texts longer than this are encoded in pieces (when exact; see the module docstring)."""
PIECE_CHARS = 32_768
"""About this many characters a piece: the next cut at or after it."""

_CUT = re.compile(r"(?<=\S) (?=\S)")
PROBE = ("Hello world, it's 12345 tokens: naïve café 日本語 (x+y)=z.\n\nTwo  spaces,\ttab; "
         "\"quoted\" [list] {obj} 3.14159 1,000,000 don't WE'LL re-use e-mail@host.org "
         "end.\r\nNew line\n  indented   code()  ;; ok?! ¿sí? 😀 emoji ... done")


def cuts(text: str, every: int = PIECE_CHARS) -> list[int]:
    """Where `text` is cut into pieces of about `every` characters (each a space between two
    non-space characters, which begins the next piece)."""
    points, at = [], every
    while at < len(text):
        found = _CUT.search(text, at)
        if found is None:
            break
        points.append(found.start())
        at = found.start() + every
    return points


def pieces(text: str, points: list[int]) -> list[str]:
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


def encode_long(tokenizer, text: str, encode_one: Callable[[str], list[int]]) -> list[int] | None:
    """`text`'s ids from its pieces, each encoded by `encode_one`; None when the text is not long
    or the pieces may not give the ids of the whole (the caller then encodes it whole)."""
    if len(text) <= LONG_TEXT_CHARS:
        return None
    points = cuts(text)
    if not points or not _exact_for(tokenizer):
        return None
    head = pieces(text[:points[1] if len(points) > 1 else len(text)], points[:1])
    if _reference(tokenizer, "".join(head)) != [t for piece in head for t in _reference(tokenizer, piece)]:
        return None
    ids: list[int] = []
    for piece in pieces(text, points):
        ids += encode_one(piece)
    return ids


def _reference(tokenizer, text: str) -> list[int]:
    """The tokenizer's own ids for `text` (transformers' call), the ids pieces must reproduce."""
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def _exact_for(tokenizer) -> bool:
    """Whether cutting at `_CUT` spaces keeps this tokenizer's ids (the probe; found once)."""
    exact = getattr(tokenizer, "_lmpo_pieces_exact", None)
    if exact is None:
        parts = pieces(PROBE, [m.start() for m in _CUT.finditer(PROBE)])
        exact = _reference(tokenizer, PROBE) == [t for part in parts for t in _reference(tokenizer, part)]
        try:
            tokenizer._lmpo_pieces_exact = exact
        except AttributeError:
            pass
    return exact
