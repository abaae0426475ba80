"""How long does attention by segments take on a DPO step? Forward and backward of every layer's
attention, on the inputs one real step gives it.

    .venv/bin/python bench/segment_attention.py [--precision bf16|fp32] [--work runs/bench-vs-trl/work]
        [--repeats 15] [--threads 2]

Runs three DPO steps of `bench/vs_trl.py`'s DPO workload (its saved 3.7M Qwen2 and pairs, in
`--work`; run the bench once to make them), keeps the queries, keys, values and segment plan
that each layer's attention received in the third, then times all layers' segment attention,
forward and backward, on them (median of `--repeats`, after 3 unrecorded). With PYTHONPATH
pointing at another checkout (`git worktree add`), it times that checkout's code on the same
inputs. The last line is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import lmpo.models.segments as segments
import lmpo.trainers.preference as preference


class Captured(Exception):
    """Raised out of the trainer once the step whose inputs are kept has run."""


def captured_inputs(work: Path, precision: str, out: Path) -> list[tuple]:
    captured, steps = [], [0]
    attend, step = segments.segment_attention, preference.preference_step

    def keep(query, key, value, plan, scaling, dropout=0.0):
        if steps[0] == 3:
            captured.append((query.detach().clone(), key.detach().clone(), value.detach().clone(), plan, scaling))
        return attend(query, key, value, plan, scaling, dropout)

    def counted(*args, **kwargs):
        steps[0] += 1
        row = step(*args, **kwargs)
        if steps[0] == 3:
            raise Captured
        return row

    segments.segment_attention, preference.preference_step = keep, counted
    cfg = preference.PreferenceConfig(model=str(work / "qwen2-3.7m-var"), data=str(work / "pairs.jsonl"), out=str(out),
                                      precision=precision, batch_size=32, lr=1e-6, warmup_steps=0, eval_problems=0,
                                      save_every=0, log_every=1, device="cpu", epochs=2)
    try:
        preference.train_preference(cfg)
    except Captured:
        pass
    finally:
        segments.segment_attention, preference.preference_step = attend, step
    return captured


def layers_forward_backward(captured: list[tuple], precision: str) -> None:
    outputs, inputs = [], []
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        for query, key, value, plan, scaling in captured:
            leaves = [t.detach().requires_grad_() for t in (query, key, value)]
            inputs += leaves
            outputs.append(segments.segment_attention(*leaves, plan, scaling))
    torch.autograd.backward(outputs, [torch.ones_like(o) for o in outputs])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--work", default="runs/bench-vs-trl/work")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(args.work)
    if not (work / "pairs.jsonl").exists():
        raise SystemExit(f"{work}: no bench inputs; run .venv/bin/python bench/vs_trl.py --quick once first")
    captured = captured_inputs(work, args.precision, Path("runs/segment-attention"))
    for _ in range(3):
        layers_forward_backward(captured, args.precision)
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        layers_forward_backward(captured, args.precision)
        times.append(time.perf_counter() - start)
    buckets = [tuple(b.queries.shape) for b in captured[0][3].buckets]
    result = {"precision": args.precision, "layers": len(captured), "buckets_per_layer": buckets,
              "seconds": statistics.median(times), "code": segments.__file__}
    print(f"{len(captured)} layers' attention by segments, forward and backward: {result['seconds'] * 1e3:.1f} ms "
          f"(median of {args.repeats}); buckets per layer (segments, queries): {buckets}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
