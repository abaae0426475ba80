"""Where does attention by segments on the CPU switch paths? Both of its paths, side by side.

    .venv/bin/python bench/attention_paths.py [--precision fp32|bf16] [--threads 2] [--repeats 9]

On the CPU, `lmpo.models.segments.segment_attention` runs a plan either as two matmuls around a
softmax (`matmul_segments`, which keeps the softmax weights for the backward) or as PyTorch's
attention kernel once per bucket (in fp32 under bf16 autocast). At bf16 it takes the matmuls
while a query sees at most `MATMUL_ATTENTION_KEYS` keys on average; at fp32 it always takes the
kernel (the matmuls would change fp32 numbers by float rounding), and this shows what the
matmuls would gain there. This times both paths, forward and
backward, on plans shaped like a GRPO step's (8 prompts of 16 tokens, each shared by 8
completions of about L tokens, 8 query heads, 2 key-value heads of 32) for L from 8 to 384, the
two alternated and each the best of `--repeats` (the least disturbed by other work on the
machine). Each line gives the plan's keys per query and kernel/matmul (above 1: the matmuls are
faster); the last line is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from lmpo.models.matmul_segments import MATMUL_ATTENTION_KEYS, keys_per_query, matmul_segment_attention
from lmpo.models.segments import kernel_segment_attention, plan_segments

LENGTHS = (8, 16, 32, 64, 128, 160, 192, 256, 384)


def grpo_like_plan(length: int, prompts: int = 8, group: int = 8, prompt: int = 16):
    """A plan for `prompts` prompts of `prompt` tokens, each shared by `group` completions of
    0.8 to 1 times `length` tokens; and its token count."""
    spans, at = [], 0
    for _ in range(prompts):
        own = list(range(at, at + prompt))
        spans.append(([], own))
        at += prompt
        for i in range(group):
            n = max(2, int(length * (0.8 + 0.2 * i / (group - 1))))
            spans.append((own, list(range(at, at + n))))
            at += n
    return plan_segments(spans, at), at


def forward_backward(attend, plan, tokens: int, bf16: bool) -> float:
    q = torch.randn(1, 8, tokens, 32, requires_grad=True)
    k, v = (torch.randn(1, 2, tokens, 32, requires_grad=True) for _ in range(2))
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = attend(q, k, v, plan, None)
    out.float().sum().backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    paths = {"kernel": kernel_segment_attention, "matmul": matmul_segment_attention}
    rows = []
    for length in LENGTHS:
        plan, tokens = grpo_like_plan(length)
        best = {name: float("inf") for name in paths}
        for _ in range(args.repeats + 1):  # the first round warms each shape's kernels up
            for name, attend in paths.items():
                best[name] = min(best[name], forward_backward(attend, plan, tokens, args.precision == "bf16"))
        keys = keys_per_query(plan)
        rows.append({"length": length, "keys_per_query": round(keys, 1), "tokens": tokens,
                     "kernel_ms": round(best["kernel"] * 1e3, 2), "matmul_ms": round(best["matmul"] * 1e3, 2)})
        limit = MATMUL_ATTENTION_KEYS.get(torch.bfloat16 if args.precision == "bf16" else torch.float32)
        taken = "matmul" if limit is not None and keys <= limit else "kernel"
        print(f"L {length:4d}: {keys:6.1f} keys a query, {tokens:5d} tokens: kernel {best['kernel'] * 1e3:7.2f} ms, "
              f"matmul {best['matmul'] * 1e3:7.2f} ms, kernel/matmul {best['kernel'] / best['matmul']:.2f} "
              f"(lmpo takes the {taken})", flush=True)
    print(json.dumps({"precision": args.precision, "threads": args.threads, "limit": limit, "rows": rows}))


if __name__ == "__main__":
    main()
