"""Does `torch.compile` pay on an update? A model's forward and backward, eager against compiled.

    .venv/bin/python bench/compile_speed.py [--what trunk|blocks] [--model sort|DIR] [--steps 30]
        [--threads 2] [--device cuda] [--precision bf16] [--new-tokens 8]

By default workload (c)'s shapes: the embedded sort task's SFT model (1M parameters), 8 prompts
x 8 completions of 4-8 tokens per step (random ids, new each step; `--new-tokens N`: N/2-N
tokens), log-probs through `completion_outputs` (the layout the trainers choose) and their
backward. `--model DIR` takes a saved Hugging Face model instead (e.g. bench/gpu_smoke.py's).
`--what trunk` compiles the whole trunk in place (`nn.Module.compile`: inductor, dynamic shapes);
`--what blocks` compiles only its RMSNorms and MLPs, as the trainers' `--compile_blocks` does
(`lmpo.models.compile_blocks`). After the compile, eager and compiled steps alternate
(`--steps` pairs on the same batches, the first 5 left out), so drift in the machine's load hits
both alike; `speedup` is the median of the per-pair ratios eager/compiled; `max_diff` is the
largest difference of the log-probs from eager's on one batch. Prints the medians and, as
its last line, a JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from lmpo.models import compile_blocks, load_model_and_tokenizer, resolve_device, uncompiled_blocks
from lmpo.models.device import without_cpu_hub_kernels
from lmpo.models.logprobs import causal_lm_parts, completion_outputs

DROPPED = 5  # the first timed steps of each arm, left out of its median


def make_batch(generator: torch.Generator, vocab: int, prompts: int = 8, group: int = 8,
               prompt_len: int = 16, new_tokens: int = 8):
    """Left-padded prompts of 11-15 tokens, each shared by `group` completions of
    `new_tokens` / 2 to `new_tokens` tokens."""
    lengths = torch.randint(11, prompt_len, (prompts,), generator=generator).repeat_interleave(group)
    prompt_ids = torch.randint(3, vocab, (prompts, prompt_len), generator=generator).repeat_interleave(group, 0)
    prompt_mask = (torch.arange(prompt_len)[None] >= prompt_len - lengths[:, None]).long()
    completion_ids = torch.randint(3, vocab, (prompts * group, new_tokens), generator=generator)
    completion_lengths = torch.randint(max(new_tokens // 2, 1), new_tokens + 1, (prompts * group,), generator=generator)
    return prompt_ids, prompt_mask, completion_ids, completion_lengths


def time_steps(model: torch.nn.Module, steps: int, seed: int = 0, precision: str = "fp32",
               new_tokens: int = 8) -> list[float]:
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    times = []
    for _ in range(steps):
        batch = [t.to(device) for t in make_batch(generator, model.config.vocab_size, new_tokens=new_tokens)]
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
    parser.add_argument("--steps", type=int, default=30, help=f"timed pairs of steps (the first {DROPPED} are dropped)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="bf16: autocast")
    parser.add_argument("--what", choices=("trunk", "blocks"), default="trunk",
                        help="compile the whole trunk, or only its RMSNorms and MLPs (--compile_blocks)")
    parser.add_argument("--model", default="sort",
                        help="sort (the embedded task's SFT model) or a saved model directory")
    parser.add_argument("--new-tokens", type=int, default=8, help="completion lengths are N/2 to N tokens")
    args = parser.parse_args()
    if args.new_tokens < 1:
        parser.error(f"--new-tokens must be at least 1, got {args.new_tokens}")
    if args.steps <= DROPPED:
        parser.error(f"--steps must be more than {DROPPED}, got {args.steps}")
    try:
        device = resolve_device(args.device)
    except ValueError as error:
        parser.error(str(error))
    torch.set_num_threads(args.threads)
    if args.model == "sort":
        from lmpo.teach.start import sft_start

        model_dir = sft_start(seed=0, quiet=True).model_dir
    elif (Path(args.model) / "config.json").is_file():
        model_dir = args.model
    else:
        parser.error(f"--model {args.model}: expected 'sort' or a saved Hugging Face model directory "
                     "(with config.json)")
    model, _ = load_model_and_tokenizer(model_dir)
    without_cpu_hub_kernels(model)
    model.to(device).train()
    trunk = causal_lm_parts(model)[0]

    def median(times: list[float]) -> float:
        return statistics.median(times[DROPPED:])

    def run(steps: int, seed: int = 0) -> list[float]:
        return time_steps(model, steps, seed, args.precision, args.new_tokens)

    def logprobs() -> torch.Tensor:
        batch = [t.to(device) for t in make_batch(torch.Generator().manual_seed(7), model.config.vocab_size,
                                                  new_tokens=args.new_tokens)]
        with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=args.precision == "bf16"):
            return completion_outputs(model, *batch[:3], lengths=batch[3]).logprobs.float()

    reference = logprobs()
    start = time.perf_counter()
    if args.what == "blocks":
        blocks = compile_blocks(model)
        compiled_call = None
    else:
        trunk.compile(dynamic=True)
        compiled_call = trunk._compiled_call_impl  # nn.Module.compile keeps the compiled call here
    first = run(3)
    compile_s = time.perf_counter() - start - sum(first[1:])
    max_diff = (logprobs() - reference).abs().max().item()

    def switch(compiled: bool) -> None:
        if args.what == "blocks":
            (compile_blocks if compiled else uncompiled_blocks)(model)
        else:
            trunk._compiled_call_impl = compiled_call if compiled else None

    switch(False)
    run(10, 1)  # eager warm-up: allocator, oneDNN primitives, CUDA kernels
    times: dict[bool, list[float]] = {False: [], True: []}
    for pair in range(args.steps):  # alternated step by step, so drift in the machine's load hits both alike
        for compiled in ((False, True) if pair % 2 == 0 else (True, False)):
            switch(compiled)
            times[compiled] += run(1, pair)
    eager, compiled = (statistics.median(times[c][DROPPED:]) for c in (False, True))
    speedup = statistics.median(e / c for e, c in zip(times[False][DROPPED:], times[True][DROPPED:]))
    what = f"{blocks} blocks" if args.what == "blocks" else "the trunk"
    print(f"forward+backward per step ({what} compiled, {args.steps} alternated pairs): eager {eager:.4f} s, "
          f"compiled {compiled:.4f} s, eager/compiled per pair {speedup:.3f} (first call {compile_s:.1f} s); "
          f"log-probs differ by at most {max_diff:.2e}")
    print(json.dumps({"what": args.what, "eager_s": round(eager, 4), "compiled_s": round(compiled, 4),
                      "speedup": round(speedup, 3), "compile_s": round(compile_s, 1), "max_diff": max_diff}))


if __name__ == "__main__":
    main()
