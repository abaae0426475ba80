"""Named model presets: small transformers causal LMs built from scratch.

They are ordinary `LlamaForCausalLM` models, so every stage's output directory loads with
`AutoModelForCausalLM.from_pretrained` and no lmpo code.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from transformers import LlamaConfig

from lmpo.names import did_you_mean


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


def is_preset(name_or_path: str) -> bool:
    """Whether `name_or_path` names one of lmpo's small built-in models (``tiny`` ...) rather than
    a Hugging Face id or a directory. A directory of that name here wins only when it holds a
    model (a config.json that is not a run's options, a LoRA adapter, or a run's model/): an empty or scratch
    folder called ``tiny`` would otherwise break every command whose default model is ``tiny``.
    Either way the choice is said once, on stderr."""
    if name_or_path not in PRESETS:
        return False
    path = Path(name_or_path)
    if not path.exists():
        return True
    run = (path / "run.json").is_file()  # a run directory's config.json is its options, not a model's
    holds_model = ((path / "config.json").is_file() and not run) or (path / "adapter_config.json").is_file()
    holds_model = holds_model or (run and (path / "model").is_dir())  # refused later: "give tiny/model"
    _say_which(name_or_path, holds_model)
    return not holds_model


@functools.cache
def _say_which(name: str, directory: bool) -> None:
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun every rank decides alike; one line is enough
        return
    what = (f"the model in ./{name} (a directory here named like the preset; give another name to use the preset)"
            if directory else f"the embedded preset (./{name} is a directory but not a model)")
    print(f"[model] {name}: {what}", file=sys.stderr)


def preset_config(name: str, vocab_size: int, pad_id: int, eos_id: int, bos_id: int) -> LlamaConfig:
    """A `LlamaConfig` for preset `name` with the tokenizer's vocabulary and special ids."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}{did_you_mean(name, PRESETS)}; choose one of: {', '.join(PRESETS)}")
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
