"""The bench's inputs, written once to a work directory and read by both workers: saved Qwen2
models (`save_pretrained`, with the embedded character tokenizer), prompt files and preference
pairs. Runs under lmpo's interpreter."""

from __future__ import annotations

import json
import random
import string
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from lmpo.models import build_char_tokenizer

NEVER = "<never>"  # an EOS the model cannot emit: its id lies past the model's vocabulary
SIZES = {"1m": (128, 4), "3.7m": (256, 4), "12m": (384, 6), "30m": (512, 8)}  # hidden, layers


@dataclass
class Workload:
    """One side-by-side measurement: the same model, data and settings for lmpo and TRL."""

    name: str
    kind: str  # grpo | dpo | rm
    model: str
    data: str
    prompts_per_step: int = 8
    group_size: int = 8
    max_new_tokens: int = 64
    beta: float = 0.04
    batch_size: int = 32
    lr: float = 1e-6
    reward: str = "vowels"  # vowels (any text) | exact (the sort task's answers)
    threads: int = 2
    seed: int = 0
    precision: str = "fp32"  # fp32 | bf16 (autocast, fp32 master weights) on both sides
    profile: str = ""  # a path: lmpo's worker writes the profiled step's torch.profiler operator table there
    options: dict = field(default_factory=dict)  # lmpo-side options (the bench's --lmpo-option)
    trl_options: dict = field(default_factory=dict)  # TRL-side TrainingArguments (the bench's --trl-option)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def build_qwen2(path: Path, size: str, lengths: str) -> int:
    """A random Qwen2 (q/k/v biases, untied head) saved with the character tokenizer.

    `lengths="fixed"`: EOS is a token past the model's vocabulary, so every completion runs to
    the budget. `"geometric"`: the head's EOS row is zero, so EOS has a constant logit and
    completion lengths follow a long-tailed (geometric) distribution cut at the budget."""
    if (path / "config.json").exists():
        return _parameters(path)
    tokenizer = build_char_tokenizer()
    vocab = len(tokenizer)
    hidden, layers = SIZES[size]
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    model = Qwen2ForCausalLM(config)
    if lengths == "fixed":
        tokenizer.add_special_tokens({"eos_token": NEVER})
        model.config.eos_token_id = model.generation_config.eos_token_id = tokenizer.eos_token_id
    else:
        with torch.no_grad():
            model.lm_head.weight[tokenizer.eos_token_id] = 0.0
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return _parameters(path)


def _parameters(path: Path) -> int:
    config = json.loads((path / "config.json").read_text())
    h, layers, inter, vocab = (config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"],
                               config["vocab_size"])
    kv = h // config["num_attention_heads"] * config["num_key_value_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * inter
    return layers * per_layer + 2 * vocab * h


def random_prompts(path: Path, n: int, length: int, seed: int) -> None:
    rng = random.Random(seed)
    letters = string.ascii_lowercase + " "
    rows = [{"prompt": "".join(rng.choice(letters) for _ in range(length)), "answer": ""} for _ in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def sort_prompts(path: Path, n: int, seed: int) -> None:
    """The embedded sort task's training prompts as text (its renderer uses them as written)."""
    from lmpo.envs import make_task

    problems = make_task("sort_digits").train_problems(n, seed)
    path.write_text("".join(json.dumps({"prompt": p.prompt, "answer": p.answer}) + "\n" for p in problems))


def random_pairs(path: Path, n: int, seed: int) -> None:
    """Pairs of ~45 tokens: a 15-character prompt and answers of 20-40 characters."""
    rng = random.Random(seed)
    letters = string.ascii_lowercase + " "
    text = lambda k: "".join(rng.choice(letters) for _ in range(k))  # noqa: E731
    rows = [{"prompt": text(15), "chosen": text(rng.randint(20, 40)), "rejected": text(rng.randint(20, 40))}
            for _ in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def linear_parameters(model_dir: str) -> int:
    """Weights that multiply every token's activations (all linear layers and the head, no embedding)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    h, layers, inter, vocab = (config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"],
                               config["vocab_size"])
    kv = h // config["num_attention_heads"] * config["num_key_value_heads"]
    return layers * (2 * h * h + 2 * h * kv + 3 * h * inter) + vocab * h


def model_shape(model_dir: str) -> tuple[int, int]:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return config["hidden_size"], config["num_hidden_layers"]
