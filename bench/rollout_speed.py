"""Rollout engine vs `model.generate`, side by side in one run, same model and sampling.

    .venv/bin/python bench/rollout_speed.py [--preset tiny] [--batch 64] [--new-tokens 64] [--no-kernels] [--through-loop]

`--through-loop` times the engine as the trainers call it: single-turn episodes through the
agent loop (`run_episodes` with `LocalEngine`), trajectories and all.

Prints a table, and as its last line a JSON object with the `speedup`: the median, over
repeats, of generate time divided by engine time, each pair measured back to back so that a
change in machine load hits both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from lmpo.envs import Problem
from lmpo.envs.env import SingleTurnEnv
from lmpo.models import load_model_and_tokenizer
from lmpo.rollout import EpisodeLimits, LocalEngine, SamplingParams, generate, kernels, run_episodes
from lmpo.rollout.render import TextRenderer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--through-loop", action="store_true",
                        help="time the engine as the trainers call it: single-turn episodes through run_episodes")
    parser.add_argument("--no-kernels", action="store_true",
                        help="measure the engine without its compiled decoding kernels (the PyTorch path)")
    args = parser.parse_args()
    if args.no_kernels:
        os.environ["LMPO_DECODE_KERNELS"] = "0"

    torch.set_num_threads(args.threads)
    model, tok = load_model_and_tokenizer(args.preset, seed=0)
    model.eval()
    gen = torch.Generator().manual_seed(0)
    prompts = [tok("".join(str(d) for d in torch.randint(0, 10, (5,), generator=gen).tolist()) + "=").input_ids
               for _ in range(args.batch)]
    params = SamplingParams(args.temperature, args.top_p, args.top_k, args.new_tokens)
    ids = torch.tensor(prompts)  # equal-length prompts: no padding needed for generate

    local = LocalEngine(model, tok.eos_token_id, tok.pad_token_id, generator=gen)
    problems = [Problem(tok.decode(p), "") for p in prompts]
    limits = EpisodeLimits(max_turns=1, max_tokens=args.new_tokens)

    def run_engine() -> tuple[float, int]:
        start = time.perf_counter()
        if args.through_loop:
            trajectories = run_episodes(local, SingleTurnEnv, problems, params, limits, TextRenderer(tok), tok)
            return time.perf_counter() - start, sum(t.num_model_tokens for t in trajectories)
        r = generate(model, prompts, params, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, generator=gen)
        return time.perf_counter() - start, int(r.lengths.sum())

    def run_generate() -> tuple[float, int]:
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                 temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                 max_new_tokens=args.new_tokens, pad_token_id=tok.pad_token_id,
                                 eos_token_id=tok.eos_token_id)
        new = out[:, ids.size(1):]
        ended = (new == tok.eos_token_id).int().cumsum(1)
        tokens = int(((ended == 0) | ((ended == 1) & (new == tok.eos_token_id))).sum())
        return time.perf_counter() - start, tokens

    run_engine(), run_generate()  # warm-up
    engine, hf = [], []
    for _ in range(args.repeats):
        engine.append(run_engine())
        hf.append(run_generate())
    engine_s = statistics.median(t for t, _ in engine)
    hf_s = statistics.median(t for t, _ in hf)
    engine_tps = statistics.median(n / t for t, n in engine)
    hf_tps = statistics.median(n / t for t, n in hf)
    print(f"{'':18s}{'median s':>10s}{'tokens/s':>12s}")
    print(f"{'lmpo engine':18s}{engine_s:10.3f}{engine_tps:12.0f}")
    print(f"{'model.generate':18s}{hf_s:10.3f}{hf_tps:12.0f}")
    speedup = statistics.median(h / e for (e, _), (h, _) in zip(engine, hf))
    print(json.dumps({"speedup": round(speedup, 3), "engine_s": round(engine_s, 4), "generate_s": round(hf_s, 4),
                      "engine_tokens_per_s": round(engine_tps), "generate_tokens_per_s": round(hf_tps),
                      "preset": args.preset, "batch": args.batch, "new_tokens": args.new_tokens,
                      "threads": args.threads, "kernels": kernels.load() is not None,
                      "through_loop": args.through_loop,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
