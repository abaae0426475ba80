"""Does `torch.compile` pay on an overhead-bound update? Workload (c)'s shapes, eager against compiled.

    .venv/bin/python bench/compile_trunk.py [--steps 30] [--threads 2] [--device cuda] [--precision bf16]

The embedded sort task's SFT model (1M parameters), 8 prompts x 8 completions of 4-8 tokens
per step (random ids, new each step), log-probs through `completion_outputs` (the layout the
trainers choose) and their backward. The trunk is compiled in place (`nn.Module.compile`:
inductor, dynamic shapes, state-dict keys unchanged); eager runs (after a warm-up) before and
after it, so drift in machine load shows; `speedup` is against the faster eager run. Prints the
medians and, as its last line, a JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from lmpo.models import load_model_and_tokenizer, resolve_device
from lmpo.models.device import without_cpu_hub_kernels
from lmpo.models.logprobs import causal_lm_parts, completion_outputs

DROPPED = 5  # the first timed steps of each arm, left out of its median


def make_batch(generator: torch.Generator, vocab: int, prompts: int = 8, group: int = 8,
               prompt_len: int = 16, new_tokens: int = 8):
    """Left-padded prompts of 11-15 tokens, each shared by `group` completions of 4-8 tokens."""
    lengths = torch.randint(11, prompt_len, (prompts,), generator=generator).repeat_interleave(group)
    prompt_ids = torch.randint(3, vocab, (prompts, prompt_len), generator=generator).repeat_interleave(group, 0)
    prompt_mask = (torch.arange(prompt_len)[None] >= prompt_len - lengths[:, None]).long()
    completion_ids = torch.randint(3, vocab, (prompts * group, new_tokens), generator=generator)
    completion_lengths = torch.randint(4, new_tokens + 1, (prompts * group,), generator=generator)
    return prompt_ids, prompt_mask, completion_ids, completion_lengths


def time_steps(model: torch.nn.Module, steps: int, seed: int = 0, precision: str = "fp32") -> list[float]:
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    times = []
    for _ in range(steps):
        batch = [t.to(device) for t in make_batch(generator, model.config.vocab_size)]
        start = time.perf_counter()
        with torch.autocast(device.type, torch.bfloat16, enabled=precision == "bf16"):
            out = completion_outputs(model, *batch[:3], lengths=batch[3])
        out.logprobs.sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help=f"timed steps per arm (the first {DROPPED} are dropped)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="bf16: autocast")
    args = parser.parse_args()
    if args.steps <= DROPPED:
        parser.error(f"--steps must be more than {DROPPED}, got {args.steps}")
    try:
        device = resolve_device(args.device)
    except ValueError as error:
        parser.error(str(error))
    torch.set_num_threads(args.threads)
    from lmpo.teach.start import sft_start

    model, _ = load_model_and_tokenizer(sft_start(seed=0, quiet=True).model_dir)
    without_cpu_hub_kernels(model)
    model.to(device).train()
    trunk = causal_lm_parts(model)[0]

    def median(times: list[float]) -> float:
        return statistics.median(times[DROPPED:])

    time_steps(model, 10, 1, args.precision)  # warm-up: allocator, oneDNN primitives
    eager_before = median(time_steps(model, args.steps, 0, args.precision))
    start = time.perf_counter()
    trunk.compile(dynamic=True)
    first = time_steps(model, 3, 0, args.precision)
    compile_s = time.perf_counter() - start - sum(first[1:])
    compiled = median(time_steps(model, args.steps, 0, args.precision))
    trunk._compiled_call_impl = None  # back to eager (nn.Module.compile keeps the compiled call here)
    eager_after = median(time_steps(model, args.steps, 0, args.precision))
    print(f"forward+backward per step: eager {eager_before:.4f} s, compiled {compiled:.4f} s "
          f"(first call {compile_s:.1f} s), eager again {eager_after:.4f} s")
    print(json.dumps({"eager_s": round(eager_before, 4), "compiled_s": round(compiled, 4),
                      "eager_after_s": round(eager_after, 4), "compile_s": round(compile_s, 1),
                      "speedup": round(min(eager_before, eager_after) / compiled, 3)}))


if __name__ == "__main__":
    main()
