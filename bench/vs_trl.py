"""lmpo against TRL, side by side on the same CPU: same saved model, prompts and settings.

Each side runs its own trainer in its own process (TRL in its own environment, nothing of TRL
in lmpo's); both load, warm up one step and `--warmup-pairs` more (unrecorded), then the driver
alternates them one step at a time (lmpo first on even pairs, TRL first on odd ones), so every
pair of steps sees the same machine; it starts one only once the other is idle (its trainer's
between-step work, logging and the next batch, done: reported as `after_step`, outside the
step on both sides), so neither runs inside the other's step. Each workload runs in each
`--precision`, both sides alike: fp32, and, where the CPU has native bf16 (AVX512-BF16/AMX),
bf16 autocast with fp32 master weights (TRL's `bf16=True`, lmpo's `precision=bf16`). Which is
TRL's best depends on the workload and the machine, so the headline table takes, per workload,
the precision where TRL's step is fastest, and sets the ratio there against the issue's target.
Reported per workload: medians over pairs of each side's step time and phases (generation,
scoring, log-probs, update), the median of the per-pair ratios TRL/lmpo (of wall time, and of
the processes' CPU time, `cpu`, the steadier one when others share the machine), the fraction of the
matrix-multiply peak each side reaches (useful FLOPs counted per step from the model's shapes
and the real token counts; the peak is the best of a torch.mm benchmark run between the
pairs, same threads, in the run's precision), each side's peak RSS, and (in the JSON only) the
median of each side's minor page faults per step. The last line is one JSON object.
`--profile` runs one more lmpo step under torch.profiler after each run's pairs (outside the
table: the profiler slows a step and holds memory) and leaves its operator table.

Workloads (random 3.7M Qwen2 with q/k/v biases and an untied head, unless said):
  grpo_fixed      (a) 8 prompts x 8 completions of exactly 64 tokens (EOS unreachable), beta 0.04
  grpo_fixed_b0   (a) the same with beta 0 (no reference model)
  grpo_var        (b) long-tailed lengths (EOS at a constant logit: geometric, cut at 192), beta 0.04
  grpo_sort       (c) the embedded sort task's SFT model (1M), ~6-token completions, beta 0.04
  dpo             32 pairs of ~45 tokens per step, reference log-probs precomputed on both sides
  rm              the reward model (Bradley-Terry), 32 pairs per step
Scaling (GRPO, fixed lengths, TRL beside): group size, completion length, model size 1M..30M;
plotted to OUT/scaling.png.

Run on a quiet machine (nothing else busy; the bench pins 2 threads per side):
    .venv/bin/python bench/vs_trl.py                 # full: every workload, 7 pairs, scaling (~15 min)
    .venv/bin/python bench/vs_trl.py --quick         # 3 pairs, three workloads, no scaling (~4 min)
    .venv/bin/python bench/vs_trl.py --precision fp32 --only dpo --profile
    .venv/bin/python bench/vs_trl.py --only grpo_var,dpo --pairs 9
    .venv/bin/python bench/vs_trl.py --lmpo-option logprob_chunk_tokens=256   # an lmpo option A/B
    .venv/bin/python bench/vs_trl.py --only dpo --lmpo-option compile_blocks=true --trl-option torch_compile=true
TRL comes from --trl-python (default .venv-trl/bin/python, made by scripts/setup-trl-venv.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "vs_trl"), str(HERE.parent)]  # the bench's helpers, this checkout's lmpo

from build import (Workload, build_qwen2, linear_parameters, model_shape, random_pairs, random_prompts,  # noqa: E402
                   sort_prompts)
from common import PREFIX  # noqa: E402

ROOT = HERE.parent
MAIN = ("grpo_fixed", "grpo_fixed_b0", "grpo_var", "grpo_sort", "dpo", "rm")
QUICK = ("grpo_fixed", "grpo_sort", "dpo")


def default_trl_python() -> str:
    for candidate in (ROOT / ".venv-trl/bin/python", Path("/work/trl-venv/bin/python")):
        if candidate.exists():
            return str(candidate)
    return str(ROOT / ".venv-trl/bin/python")


def default_precisions() -> str:
    from lmpo.models.device import cpu_has_native_bf16

    return "fp32,bf16" if cpu_has_native_bf16() else "fp32"


def main_workloads(work: Path, pairs: int) -> dict[str, Workload]:
    fixed, var = work / "qwen2-3.7m-fixed", work / "qwen2-3.7m-var"
    build_qwen2(fixed, "3.7m", "fixed")
    build_qwen2(var, "3.7m", "geometric")
    prompts, sort, pair_file = work / "prompts.jsonl", work / "sort.jsonl", work / "pairs.jsonl"
    random_prompts(prompts, 512, 16, seed=0)
    sort_prompts(sort, 512, seed=0)
    random_pairs(pair_file, 32 * (pairs + 4), seed=0)  # a warm-up step, the pairs, spare
    from lmpo.teach.start import sft_start

    sft = sft_start(seed=0, quiet=True).model_dir
    return {"grpo_fixed": Workload("grpo_fixed", "grpo", str(fixed), str(prompts)),
            "grpo_fixed_b0": Workload("grpo_fixed_b0", "grpo", str(fixed), str(prompts), beta=0.0),
            "grpo_var": Workload("grpo_var", "grpo", str(var), str(prompts), max_new_tokens=192),
            "grpo_sort": Workload("grpo_sort", "grpo", sft, str(sort), max_new_tokens=12, reward="exact"),
            "dpo": Workload("dpo", "dpo", str(var), str(pair_file), lr=1e-6),
            "rm": Workload("rm", "rm", str(var), str(pair_file), lr=1e-6)}


def scaling_workloads(work: Path, quick: bool) -> list[tuple[str, float, Workload]]:
    prompts = work / "prompts.jsonl"
    models = {size: work / f"qwen2-{size}-fixed" for size in ("1m", "3.7m", "12m", "30m")}
    for size, path in models.items():
        build_qwen2(path, size, "fixed")
    base = Workload("scale", "grpo", str(models["3.7m"]), str(prompts), prompts_per_step=4, group_size=8,
                    max_new_tokens=32)
    out = [("group size", g, replace(base, name=f"scale_group_{g}", group_size=g)) for g in (4, 8, 16)]
    out += [("completion tokens", n, replace(base, name=f"scale_len_{n}", max_new_tokens=n)) for n in (16, 32, 64)]
    out += [("parameters (M)", linear_parameters(str(p)) / 1e6, replace(base, name=f"scale_model_{s}", model=str(p),
                                                                      prompts_per_step=2))
            for s, p in models.items()]
    return out[::3] if quick else out


class Worker:
    """One side's trainer process, stepped on demand."""

    def __init__(self, side: str, python: str, workload: Workload, work: Path):
        self.side = side
        spec = work / f"{workload.name}-{side}.json"
        spec.write_text(workload.to_json())
        out = Path(tempfile.mkdtemp(prefix=f"{workload.name}-{side}-", dir=work))
        script = HERE / "vs_trl" / f"{side}_worker.py"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(workload.threads)}
        self.log = open(out / "worker.log", "w")
        self.proc = subprocess.Popen([python, str(script), str(spec), str(out / "run")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, cwd=str(out))
        self.peak_rss = 0.0

    def read(self, measured: bool = True) -> dict:
        """The next result (READY or a step's timings), returned once the worker says it is idle:
        its between-step work (`after_step_s`, timed but not part of the step) never overlaps
        the other side's step. An unmeasured step's memory does not count in the peak."""
        result = self.line()
        if measured:
            self.peak_rss = max(self.peak_rss, result.get("peak_rss_mb", 0.0))
        return {**result, "after_step_s": self.line()["after_step_s"]}

    def line(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(PREFIX):
                result = json.loads(line[len(PREFIX):])
                if "error" in result:
                    raise RuntimeError(f"{self.side}: {result['error']} (log: {self.log.name})")
                return result
        raise RuntimeError(f"{self.side} worker exited (code {self.proc.wait()}); see {self.log.name}")

    def step(self, profile: bool = False) -> dict:
        """One step; with `profile`, one run under the profiler, kept out of the peak RSS."""
        self.proc.stdin.write("step profile\n" if profile else "step\n")
        self.proc.stdin.flush()
        return self.read(measured=not profile)

    def close(self) -> None:
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def matmul_peak_gflops(threads: int, precision: str = "fp32", size: int = 1024, reps: int = 6) -> float:
    """Best sustained torch.mm rate on `threads` threads in the run's precision (the machine's
    matmul peak: bf16 autocast's matmuls run in bf16)."""
    import torch

    torch.set_num_threads(threads)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = torch.randn(2 * size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * 2 * size * size * size / best / 1e9


def step_flops(w: Workload, r: dict) -> dict[str, float]:
    """Useful FLOPs of one step's phases: 2 per weight per token forward, 4 more backward, plus
    causal attention (from the mean sequence length); padding counts for nothing."""
    n_lin = linear_parameters(w.model)
    hidden, layers = model_shape(w.model)
    seqs = max(r.get("sequences", 1), 1)
    tokens = r.get("tokens", r.get("prompt_tokens", 0) + r.get("completion_tokens", 0))
    mean_len = tokens / seqs
    forward = 2 * n_lin * tokens + 2 * hidden * layers * seqs * mean_len ** 2  # QK^T and AV, causal half
    if w.kind != "grpo":
        return {"update": 3 * forward}
    return {"generate": forward, "logprobs": forward if w.beta > 0 else 0.0, "update": 3 * forward}


def run_workload(w: Workload, pairs: int, trl_python: str, work: Path, say, warmup_pairs: int = 2) -> dict:
    lmpo = Worker("lmpo", sys.executable, w, work)
    ready_l = lmpo.read()  # one at a time: set-ups and warm-ups do not overlap
    trl = Worker("trl", trl_python, w, work)
    ready_t = trl.read()
    say(f"  {w.name} ({w.precision}): warm-up step lmpo {ready_l['step_s']:.2f}s, TRL {ready_t['step_s']:.2f}s")
    rows, peaks = [], []
    try:
        for _ in range(warmup_pairs):  # unrecorded: allocators and kernel caches settle over the first steps
            lmpo.step(), trl.step()
        for i in range(pairs):
            first, second = (lmpo, trl) if i % 2 == 0 else (trl, lmpo)
            a, b = first.step(), second.step()
            peaks.append(matmul_peak_gflops(w.threads, w.precision))
            rows.append((a, b) if first is lmpo else (b, a))
            say(f"  {w.name} pair {i + 1}: lmpo {rows[-1][0]['step_s']:.3f}s  TRL {rows[-1][1]['step_s']:.3f}s  "
                f"ratio {rows[-1][1]['step_s'] / rows[-1][0]['step_s']:.2f}")
        if w.profile:  # after the pairs: the profiler's time and memory stay out of the table
            lmpo.step(profile=True)
    finally:
        lmpo.close()
        trl.close()
    return summarise(w, rows, peaks, lmpo.peak_rss, trl.peak_rss)


def summarise(w: Workload, rows: list[tuple[dict, dict]], peaks: list[float], rss_l: float, rss_t: float) -> dict:
    med = statistics.median
    peak = max(peaks)  # the best the machine did in this workload's run: a conservative peak
    out = {"workload": w.name, "precision": w.precision, "pairs": len(rows),
           "ratio_median": med(t["step_s"] / l["step_s"] for l, t in rows),
           "ratio_min": min(t["step_s"] / l["step_s"] for l, t in rows),
           "ratio_max": max(t["step_s"] / l["step_s"] for l, t in rows), "matmul_peak_gflops": peak,
           "cpu_ratio_median": med(t["cpu_s"] / l["cpu_s"] for l, t in rows)}
    for side, index, rss in (("lmpo", 0, rss_l), ("trl", 1, rss_t)):
        results = [r[index] for r in rows]
        phases = sorted({k for r in results for k in r if k.endswith("_s")})
        side_out = {k: med(r.get(k, 0.0) for r in results) for k in phases}
        flops = [step_flops(w, r) for r in results]
        side_out["peak_fraction"] = med(sum(f.values()) / r["step_s"] / 1e9 / peak for f, r in zip(flops, results))
        side_out["update_peak_fraction"] = med(f["update"] / max(r.get("update_s", r["step_s"]), 1e-9) / 1e9 / peak
                                               for f, r in zip(flops, results))
        side_out["tokens_per_step"] = med(r.get("tokens", r.get("prompt_tokens", 0) + r.get("completion_tokens", 0))
                                          for r in results)
        side_out["peak_rss_mb"] = rss
        side_out["minor_faults"] = med(r.get("minor_faults", 0) for r in results)
        out[side] = side_out
    return out


def table(results: list[dict]) -> str:
    head = (f"{'workload':<15}{'prec':>5}{'lmpo s':>8}{'TRL s':>8}{'TRL/lmpo':>9}{'range':>12}{'cpu':>6}  "
            f"{'lmpo gen/lp/upd':>18}  {'TRL gen/lp/upd':>18}{'peak% l/T':>11}{'RSS MiB l/T':>14}")
    lines = [head]
    for r in results:
        l, t = r["lmpo"], r["trl"]
        phases = lambda s: "/".join(f"{s.get(k, 0.0):.2f}" for k in ("generate_s", "logprobs_s", "update_s"))  # noqa: E731
        lines.append(f"{r['workload']:<15}{r.get('precision', 'fp32'):>5}{l['step_s']:>8.3f}{t['step_s']:>8.3f}{r['ratio_median']:>9.2f}"
                     f"{r['ratio_min']:>6.2f}-{r['ratio_max']:<5.2f}{r['cpu_ratio_median']:>6.2f}  {phases(l):>18}  {phases(t):>18}"
                     f"{100 * l['peak_fraction']:>5.0f}/{100 * t['peak_fraction']:<5.0f}"
                     f"{l['peak_rss_mb']:>7.0f}/{t['peak_rss_mb']:<6.0f}")
    return "\n".join(lines)


TARGETS = {"grpo_fixed": 1.6, "grpo_fixed_b0": 1.6, "grpo_var": 2.0, "grpo_sort": 2.0, "dpo": 2.0}


def headline(results: list[dict]) -> list[dict]:
    """Per workload, the precision at which TRL's step is fastest (TRL at its best on this
    machine), both sides at that precision, and the issue's target for the ratio."""
    out = []
    for name in dict.fromkeys(r["workload"] for r in results):
        best = min((r for r in results if r["workload"] == name), key=lambda r: r["trl"]["step_s"])
        target = TARGETS.get(name)
        out.append({"workload": name, "precision": best.get("precision", "fp32"), "ratio_median": best["ratio_median"],
                    "target": target, "met": None if target is None else best["ratio_median"] >= target,
                    "lmpo_peak_fraction": best["lmpo"]["peak_fraction"],
                    "rss_lower": best["lmpo"]["peak_rss_mb"] <= best["trl"]["peak_rss_mb"]})
    return out


def headline_table(rows: list[dict]) -> str:
    lines = [f"{'workload':<15}{'TRL best':>9}{'TRL/lmpo':>9}{'target':>8}  {'met':<4}{'lmpo peak%':>11}"]
    for h in rows:
        target = f"{h['target']:.1f}" if h["target"] else "-"
        met = "-" if h["met"] is None else ("yes" if h["met"] else "no")
        lines.append(f"{h['workload']:<15}{h['precision']:>9}{h['ratio_median']:>9.2f}{target:>8}  {met:<4}"
                     f"{100 * h['lmpo_peak_fraction']:>10.0f}%")
    return "\n".join(lines)


def plot_scaling(points: list[tuple[str, float, dict]], path: Path, threads: int, precision: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_names = list(dict.fromkeys(p[0] for p in points))
    fig, axes = plt.subplots(1, len(axes_names), figsize=(4.2 * len(axes_names), 3.4), squeeze=False)
    for ax, name in zip(axes[0], axes_names):
        mine = sorted((x, r) for n, x, r in points if n == name)
        xs = [x for x, _ in mine]
        for side, style in (("lmpo", "o-"), ("trl", "s--")):
            ax.plot(xs, [r[side]["step_s"] for _, r in mine], style, label="lmpo" if side == "lmpo" else "TRL")
        ax.set_xlabel(name)
        ax.set_ylabel("seconds per GRPO step")
        ax.set_xscale("log", base=2 if name != "parameters (M)" else 10)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"lmpo vs TRL: GRPO step time (CPU, {precision}, {threads} thread(s) each, medians of interleaved "
                 "pairs)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_options(items: list[str]) -> dict:
    options = {}
    for item in items:
        key, _, value = item.partition("=")
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 pairs of grpo_fixed, grpo_sort and dpo; no scaling")
    parser.add_argument("--only", default="", help=f"comma-separated workloads out of {', '.join(MAIN)}")
    parser.add_argument("--pairs", type=int, default=0, help="interleaved step pairs per workload (default 7; quick 3)")
    parser.add_argument("--scaling", choices=("auto", "on", "off"), default="auto",
                        help="scaling curves: auto = in the full run only")
    parser.add_argument("--scaling-pairs", type=int, default=3)
    parser.add_argument("--trl-python", default=default_trl_python(), help="interpreter of the TRL environment")
    parser.add_argument("--lmpo-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an option of lmpo's trainer config for its side (repeatable), to measure a variant")
    parser.add_argument("--trl-option", action="append", default=[], metavar="KEY=VALUE",
                        help="a TrainingArguments field for TRL's side (repeatable), e.g. torch_compile=true")
    parser.add_argument("--precision", default=default_precisions(),
                        help="comma-separated, each workload run at each, both sides alike: fp32, or bf16 autocast "
                             "with fp32 master weights (default: both where the CPU has native bf16, else fp32); "
                             "the headline takes, per workload, the one where TRL is fastest")
    parser.add_argument("--profile", action="store_true",
                        help="one more lmpo step after the pairs runs under torch.profiler (not in the "
                             "table); its operator table goes to OUT/profile-WORKLOAD-PRECISION.txt")
    parser.add_argument("--warmup-pairs", type=int, default=2, help="unrecorded pairs after each side's warm-up step")
    parser.add_argument("--threads", type=int, default=2,
                        help="torch threads per side (1 gives steadier figures on a machine others are using)")
    parser.add_argument("--out", default=str(ROOT / "runs" / "bench-vs-trl"), help="results, logs and the plot")
    args = parser.parse_args()
    if not Path(args.trl_python).exists():
        parser.error(f"no TRL interpreter at {args.trl_python}; run scripts/setup-trl-venv.sh or pass --trl-python")
    pairs = args.pairs or (3 if args.quick else 7)
    precisions = [p for p in args.precision.split(",") if p]
    if not precisions or any(p not in ("fp32", "bf16") for p in precisions):
        parser.error(f"--precision {args.precision!r}: expected fp32, bf16 or fp32,bf16")
    names = [n for n in args.only.split(",") if n] or list(QUICK if args.quick else MAIN)
    out = Path(args.out)
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    options, trl_options = parse_options(args.lmpo_option), parse_options(args.trl_option)
    workloads = main_workloads(work, pairs + args.warmup_pairs)
    results = []
    for name in names:
        for precision in precisions:
            w = replace(workloads[name], options=options, trl_options=trl_options, threads=args.threads,
                        precision=precision,
                        profile=str(out.resolve() / f"profile-{name}-{precision}.txt") if args.profile else "")
            results.append(run_workload(w, pairs, args.trl_python, work, say, args.warmup_pairs))
            (out / "results.json").write_text(json.dumps({"pairs": pairs, "results": results}, indent=1))
    scaling = []
    if args.scaling == "on" or (args.scaling == "auto" and not args.quick and not args.only):
        for axis, x, w in scaling_workloads(work, args.quick):  # in the first precision listed
            w = replace(w, options=options, trl_options=trl_options, threads=args.threads, precision=precisions[0])
            scaling.append((axis, x, run_workload(w, args.scaling_pairs, args.trl_python, work, say, 1)))
        plot_scaling(scaling, out / "scaling.png", args.threads, precisions[0])
        say(f"scaling curves: {out / 'scaling.png'}")
    print(table(results))
    if scaling:
        print(table([r for _, _, r in scaling]))
    best = headline(results)
    print(headline_table(best))
    summary = {"pairs": pairs, "threads": args.threads, "lmpo_options": options, "trl_options": trl_options,
               "results": results,
               "headline": best, "scaling": [{"axis": a, "x": x, **r} for a, x, r in scaling]}
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
