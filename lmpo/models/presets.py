"""Named model presets: small transformers causal LMs built from scratch.

They are ordinary `LlamaForCausalLM` models, so every stage's output directory loads with
`AutoModelForCausalLM.from_pretrained` and no lmpo code.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import LlamaConfig


@dataclass(frozen=True)
class ModelPreset:
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_positions: int
    description: str


PRESETS: dict[str, ModelPreset] = {
    "tiny": ModelPreset(128, 4, 4, 512, 256, "about 1.0M parameters; trains on a laptop CPU in minutes"),
    "small": ModelPreset(256, 6, 8, 1024, 512, "about 6.3M parameters; a few times slower than tiny"),
}


def preset_config(name: str, vocab_size: int, pad_id: int, eos_id: int, bos_id: int) -> LlamaConfig:
    """A `LlamaConfig` for preset `name` with the tokenizer's vocabulary and special ids."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of: {', '.join(PRESETS)}")
    p = PRESETS[name]
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=p.hidden_size,
        intermediate_size=p.intermediate_size,
        num_hidden_layers=p.num_layers,
        num_attention_heads=p.num_heads,
        num_key_value_heads=p.num_heads,
        max_position_embeddings=p.max_positions,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=bos_id,
        rms_norm_eps=1e-5,
        initializer_range=0.02,
    )
