"""The embedded character-level tokenizer.

Built with the `tokenizers` library and wrapped as a transformers `PreTrainedTokenizerFast`,
so `AutoTokenizer.from_pretrained(run_dir)` loads it with no lmpo code. One token per
character keeps arithmetic-like tasks learnable by a 1M-parameter model: a digit is always
the same token wherever it appears.
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>")
SPECIAL_TOKENS = (PAD, EOS, BOS, UNK, *ROLE_TOKENS)
ALPHABET = "\n" + string.printable[:95]  # digits, letters, punctuation, space

# Role markers then content; an assistant turn ends with <eos>, so training on assistant
# tokens teaches the model to stop. Tool output is a `tool` turn. Prefix-preserving: earlier
# turns render the same whatever follows (multi-turn rollouts append to what they hold).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}<eos>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_char_tokenizer(alphabet: str = ALPHABET) -> PreTrainedTokenizerFast:
    """A tokenizer with one token per character of `alphabet` plus the special tokens."""
    chars = list(dict.fromkeys(alphabet))
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *chars])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        unk_token=UNK,
        additional_special_tokens=list(ROLE_TOKENS),
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.model_max_length = 4096
    return tok
