"""A very long text (one 5 MB line of a CPT corpus) is encoded in pieces, so memory follows the
ids kept: one fast-tokenizer encoding of a whole 5M-token text took ~1.8 GB (its token strings,
offsets and masks), where the same bytes over 2500 lines took ~80 MB. The ids must be those of
the whole text: pieces are used only where they give them, else the text is encoded whole."""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers, decoders
from transformers import PreTrainedTokenizerFast

from lmpo.envs.data import chat, load_sft
from lmpo.envs.data.long_text import LONG_TEXT_CHARS
from lmpo.models import load_tokenizer

WORDS = ["the", "cat", "sat", "on", "a", "mat", "12345", "3.14", "don't", "naïve", "(x+y)", "e-mail", "\n", "  ",
         "end.", "日本", "ok?!", "\t", "tokenizer", "pieces"]


def _text(chars: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    out, n = [], 0
    while n < chars:
        word = rng.choice(WORDS)
        out.append(word)
        n += len(word) + 1
    return " ".join(out)


def _byte_level_bpe() -> PreTrainedTokenizerFast:
    """A GPT-2-style tokenizer (byte-level pre-tokenizer, BPE merges), trained here on the words above."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator([_text(20_000, seed) for seed in range(3)],
                             trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                 special_tokens=["<eos>"]))
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>")


def _sentencepiece_like() -> PreTrainedTokenizerFast:
    """As Llama 2's: no pre-tokenizer, a normalizer that writes ▁ before every text it is given,
    so a piece that begins with a space gains a ▁ the whole text does not have there."""
    core = Tokenizer(models.BPE(unk_token="<unk>"))
    core.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    core.train_from_iterator([_text(20_000, seed) for seed in range(3)],
                             trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<eos>"]))
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", unk_token="<unk>")


@pytest.mark.parametrize("make", [lambda: load_tokenizer("tiny"), _byte_level_bpe, _sentencepiece_like],
                         ids=["embedded", "byte_level_bpe", "sentencepiece_like"])
def test_a_long_text_gets_the_ids_of_the_whole_text(make):
    tokenizer = make()
    text = _text(3 * LONG_TEXT_CHARS)
    assert chat.encode(tokenizer, text) == list(tokenizer(text, add_special_tokens=False).input_ids)


def test_a_long_line_is_never_tokenized_whole(tmp_path, monkeypatch):
    """What bounds the memory: no call to the tokenizer or its backend gets the whole 5 MB line."""
    tokenizer = load_tokenizer("tiny")
    seen: list[int] = []
    backend = tokenizer.backend_tokenizer

    class Recording:
        def __getattr__(self, name):
            return getattr(backend, name)

        def encode(self, text, *args, **kwargs):
            seen.append(len(text))
            return backend.encode(text, *args, **kwargs)

    own_call = type(tokenizer).__call__

    def call(self, text, *args, **kwargs):
        seen.append(len(text))
        return own_call(self, text, *args, **kwargs)

    monkeypatch.setattr(type(tokenizer), "backend_tokenizer", property(lambda self: Recording()))
    monkeypatch.setattr(type(tokenizer), "__call__", call)
    text = _text(8 * LONG_TEXT_CHARS, seed=1)
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"text": text}) + "\n")
    examples, _ = load_sft(path, tokenizer, max_length=10**7)
    assert seen and max(seen) <= LONG_TEXT_CHARS
    monkeypatch.undo()
    assert examples[0].input_ids == list(tokenizer(text, add_special_tokens=False).input_ids) + [tokenizer.eos_token_id]
