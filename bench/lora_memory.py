"""Peak memory of a GRPO run with a KL reference, with and without LoRA, side by side.

Builds a random Qwen2 locally (default ~60M parameters, untied head, q/k/v biases), saves it
with the embedded tokenizer, and runs `lmpo train grpo` on it twice in fresh processes: full
fine-tuning (policy + a frozen reference copy + AdamW state for every weight) and LoRA (one
model; the reference is the same model with its adapter disabled; AdamW state for the adapter
only). Prints each run's peak RSS and the models it held, and the ratio, as a last-line JSON.

    .venv/bin/python bench/lora_memory.py [--hidden 512] [--layers 8] [--steps 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from lmpo.models import build_char_tokenizer


def build(path: Path, hidden: int, layers: int) -> int:
    tokenizer = build_char_tokenizer()
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden,
                         num_hidden_layers=layers, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=256, tie_word_embeddings=False,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def run(model: Path, out: Path, steps: int, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "lmpo", "train", "grpo", "--model", str(model), "--out", str(out),
           "--steps", str(steps), "--prompts_per_step", "4", "--group_size", "4", "--eval_problems", "0",
           "--beta", "0.04", "--save_every", "0", "--threads", "2", *extra]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    result = json.loads((out / "result.json").read_text())
    return {"peak_rss_mb": result["peak_rss_mb"], "models_held": result["models_held"], "seconds": round(result["seconds"], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--lora_r", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        params = build(tmp / "qwen2", args.hidden, args.layers)
        full = run(tmp / "qwen2", tmp / "full", args.steps, [])
        lora = run(tmp / "qwen2", tmp / "lora", args.steps, ["--lora_r", str(args.lora_r)])
    print(f"model: random Qwen2, {params / 1e6:.1f}M parameters ({4 * params / 2**20:.0f} MiB in fp32)")
    print(f"full fine-tuning: peak RSS {full['peak_rss_mb']:.0f} MiB, models held {full['models_held']}")
    print(f"LoRA r={args.lora_r}:        peak RSS {lora['peak_rss_mb']:.0f} MiB, models held {lora['models_held']}")
    print(json.dumps({"parameters": params, "full": full, "lora": lora,
                      "rss_ratio_lora_to_full": round(lora["peak_rss_mb"] / full["peak_rss_mb"], 3)}))


if __name__ == "__main__":
    main()
