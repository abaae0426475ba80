"""The Python half of bench/gpu_smoke.sh: build the smoke model, then summarise the runs.

    python bench/gpu_smoke.py build --shape qwen05b|tiny --out DIR [--device cuda]
    python bench/gpu_smoke.py summarize --model DIR --batch B RUN_DIR...

`summarize` prints one JSON object: per engine the median step time (warm-up step excluded),
generated tokens per second, MFU and the training process's peak GPU memory.

MFU = 6 * N * tokens_per_step / step_time / peak_flops, with N every parameter of the model
(tied embeddings once), tokens_per_step the batch's prompt + completion tokens (the tokens
the update's forward and backward see; completion tokens alone when the run does not log
`prompt_len_mean`, flagged in `mfu_tokens`), and peak_flops the GPU's dense bf16 tensor-core
peak from `PEAK_BF16_TFLOPS` (matched on `torch.cuda.get_device_name()`; null when unknown).
The whole step counts (generation, scoring and the update), so this is the MFU of the loop,
not of the update alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

# dense bf16 tensor-core peaks (no sparsity), TFLOP/s, from the vendors' data sheets; the first
# matching substring of the device name wins, so specific names come before general ones
PEAK_BF16_TFLOPS = [
    ("GB200", 2500.0), ("B200", 2250.0), ("H200", 989.0), ("GH200", 989.0), ("H100 PCIe", 756.0),
    ("H100", 989.0), ("H800", 989.0), ("A100", 312.0), ("A800", 312.0), ("L40S", 362.0), ("L40", 181.0),
    ("A10G", 70.0), ("A10", 125.0), ("L4", 121.0), ("RTX 4090", 165.0), ("A6000", 155.0),
]

SHAPES = {
    # Qwen2-0.5B's shape (random weights)
    "qwen05b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                    num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=4096),
    # seconds on a CPU: checks the script's mechanics
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=0, tie_word_embeddings=True, max_position_embeddings=512),
}


def peak_tflops(device_name: str) -> float | None:
    for key, tflops in PEAK_BF16_TFLOPS:
        if key.lower() in device_name.lower():
            return tflops
    return None


def smoke_tokenizer(vocab_size: int):
    """lmpo's character tokenizer (what the tasks are built for), its vocabulary padded with
    ordinary filler tokens to `vocab_size`, so that every id a random model samples decodes."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from lmpo.models.tokenizer import ALPHABET, BOS, CHAT_TEMPLATE, EOS, PAD, ROLE_TOKENS, SPECIAL_TOKENS, UNK

    names = [*SPECIAL_TOKENS, *dict.fromkeys(ALPHABET)]
    names += [f"<x{i}>" for i in range(max(0, vocab_size - len(names)))]
    core = Tokenizer(models.WordLevel(vocab={name: i for i, name in enumerate(names)}, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS, bos_token=BOS, unk_token=UNK,
                                  additional_special_tokens=list(ROLE_TOKENS), padding_side="left",
                                  clean_up_tokenization_spaces=False)
    tok.chat_template = CHAT_TEMPLATE
    tok.model_max_length = 4096
    return tok


def build(shape: str, out: str, device: str = "cpu", seed: int = 0) -> dict:
    """Save a random Qwen2 of `shape` and its tokenizer to `out`; returns what was built."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    settings = dict(SHAPES[shape])
    tok = smoke_tokenizer(settings["vocab_size"])
    settings["vocab_size"] = max(settings["vocab_size"], len(tok))
    config = Qwen2Config(**settings, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                         bos_token_id=tok.bos_token_id)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    dtype = torch.bfloat16 if shape != "tiny" else torch.float32  # half the disk and load time
    model.to(dtype).save_pretrained(out)
    tok.save_pretrained(out)
    return {"model_dir": out, "shape": shape, "parameters": n_params, "vocab_size": config.vocab_size}


def count_parameters(model_dir: str) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return sum(p.numel() for p in model.parameters())


def _rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "time_step" in r]


def run_summary(run_dir: Path, n_params: int, batch: int, peak: float | None) -> dict:
    """One run's figures from its metrics.jsonl and result.json (see the module docstring)."""
    rows = _rows(run_dir)
    if not rows:
        return {"error": f"no step metrics in {run_dir / 'metrics.jsonl'} (see {run_dir}.log)"}
    timed = rows[1:] or rows  # the first step pays for compilation, CUDA graphs, allocator warm-up
    step_time = statistics.median(r["time_step"] for r in timed)
    completion = statistics.median(r["completion_len_mean"] for r in timed) * batch
    prompt_lens = [r["prompt_len_mean"] for r in timed if "prompt_len_mean" in r]
    tokens = completion + (statistics.median(prompt_lens) * batch if prompt_lens else 0.0)
    out = {"steps": len(rows), "step_time_s": round(step_time, 4),
           "tokens_per_s": round(completion / step_time, 1),
           "generate_tokens_per_s": round(completion / statistics.median(r["time_generate"] for r in timed), 1)
           if all(r.get("time_generate") for r in timed) else None,
           "mfu": round(6 * n_params * tokens / step_time / (peak * 1e12), 5) if peak else None,
           "mfu_tokens": "prompt+completion" if prompt_lens else "completion_only"}
    result = run_dir / "result.json"
    extra = json.loads(result.read_text()) if result.exists() else {}
    out["peak_gpu_mb"] = extra.get("peak_gpu_mb", rows[-1].get("peak_gpu_mb"))
    for key in ("mismatch_kl", "tis_clipped_frac", "probe_mean_abs_diff"):
        if key in rows[-1]:
            out[key] = rows[-1][key]
    return out


def summarize(model_dir: str, run_dirs: list[str], batch: int, device_name: str | None = None) -> dict:
    if device_name is None:
        import torch

        device_name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    peak = peak_tflops(device_name)
    n_params = count_parameters(model_dir)
    summary = {"device": device_name, "peak_bf16_tflops": peak, "parameters": n_params, "batch": batch}
    for run_dir in run_dirs:
        engine = Path(run_dir).name.removeprefix("run-")
        summary[engine] = run_summary(Path(run_dir), n_params, batch, peak)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build")
    b.add_argument("--shape", choices=list(SHAPES), default="qwen05b")
    b.add_argument("--out", required=True)
    b.add_argument("--device", default="cpu")
    s = sub.add_parser("summarize")
    s.add_argument("--model", required=True)
    s.add_argument("--batch", type=int, required=True)
    s.add_argument("runs", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "build":
        print(json.dumps(build(args.shape, args.out, args.device)))
        return 0
    summary = summarize(args.model, args.runs, args.batch)
    print(json.dumps(summary))
    return 0 if all("error" not in v for v in summary.values() if isinstance(v, dict)) else 1


if __name__ == "__main__":
    sys.exit(main())
