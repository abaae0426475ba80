"""Token ids of texts: `encode` (a text inside a sequence), `encode_start` (a text that starts
one, after the tokenizer's leading special tokens) and `starting`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

from lmpo.envs.data.long_text import LONG_TEXT_CHARS, encode_long

CHECKED_CALLS = 64  # the backend's ids are compared with the tokenizer's own on this many texts first
LEADING_PROBE = "a"


def encode(tokenizer: PreTrainedTokenizerBase, text: str, count: bool = True) -> list[int]:
    """Token ids without added special tokens: a text inside a sequence (a completion, a turn).
    A text that starts one takes the tokenizer's leading tokens too (`encode_start`).

    A fast tokenizer's Rust backend is called directly: transformers' own call costs ~10x the
    encoding itself per text (a 300,000-row file: 15 s of 16 s to load). Its first
    `CHECKED_CALLS` texts are encoded both ways, and any difference sends this tokenizer back to
    transformers' call for good, so no tokenizer's ids change. A very long text is encoded in
    pieces where that gives the same ids (`long_text`): memory for its ids, not a 5 MB encoding."""
    if len(text) > LONG_TEXT_CHARS:
        ids = encode_long(tokenizer, text, lambda piece: _encode(tokenizer, piece, count))
        if ids is not None:
            return ids
    return _encode(tokenizer, text, count)


def _encode(tokenizer: PreTrainedTokenizerBase, text: str, count: bool) -> list[int]:
    state = _backend_state(tokenizer)
    # see lmpo.envs.data.unknown; `count=False` for text whose tokens are counted elsewhere
    unknown = getattr(tokenizer, "_lmpo_unknown", None) if count else None
    if state["use"] is False:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        if unknown is not None:
            unknown.note(tokenizer, text, ids)
        return ids
    encoding = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
    ids = encoding.ids
    if state["checked"] < CHECKED_CALLS:
        state["checked"] += 1
        own = tokenizer(text, add_special_tokens=False).input_ids
        if ids != own:
            state["use"] = False
            if unknown is not None:
                unknown.note(tokenizer, text, own)
            return own
    if unknown is not None:
        unknown.note(tokenizer, text, ids, encoding)
    return ids


def leading_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The special tokens the tokenizer puts before a text it encodes with its defaults: the BOS
    of Llama, Gemma or Mistral; none for Qwen or the embedded tokenizer. Found once per tokenizer,
    from a probe encoded with and without them."""
    lead = getattr(tokenizer, "_lmpo_leading_ids", None)
    if lead is None:
        plain = list(tokenizer(LEADING_PROBE, add_special_tokens=False).input_ids)
        full = list(tokenizer(LEADING_PROBE).input_ids)
        at = next((i for i in range(len(full) - len(plain) + 1) if full[i:i + len(plain)] == plain), 0)
        lead = full[:at]
        try:
            tokenizer._lmpo_leading_ids = lead
        except AttributeError:
            pass
    return lead


def starting(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> list[int]:
    """`ids` as the start of a sequence the model reads: after the tokenizer's leading special
    tokens (`leading_ids`), unless they begin it already (a chat template that writes BOS).
    A model pre-trained with BOS before every text degrades without one (TRL issue 3520)."""
    lead = leading_ids(tokenizer)
    return ids if ids[:len(lead)] == lead else lead + ids


def encode_start(tokenizer: PreTrainedTokenizerBase, text: str, count: bool = True) -> list[int]:
    """A text that starts a sequence (a prompt, a document): `starting(tokenizer, encode(...))`."""
    return starting(tokenizer, encode(tokenizer, text, count))


def _backend_state(tokenizer) -> dict:
    state = getattr(tokenizer, "_lmpo_backend_encode", None)
    if state is None:
        state = {"use": None if getattr(tokenizer, "backend_tokenizer", None) is not None else False, "checked": 0}
        try:
            tokenizer._lmpo_backend_encode = state
        except AttributeError:
            state["use"] = False
    return state
