"""Every RL preset from the same SFT checkpoint with the same budget, side by side.

    .venv/bin/python bench/rl_presets.py [--sft-model DIR] [--steps 150] [--out bench/results/rl_presets]

Without --sft-model it first runs CPT and SFT (the pipeline's defaults) to make one. Each preset
runs in its own process (`lmpo train PRESET`) so that its peak memory is its own. Writes
`OUT/table.md` and `OUT/results.json`, prints the table, and ends with a JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from lmpo.trainers.presets import RL_PRESETS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sft-model", default="")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--presets", default=",".join(RL_PRESETS))
    parser.add_argument("--out", default="bench/results/rl_presets")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lmpo = [sys.executable, "-m", "lmpo"]
    common = ["--seed", str(args.seed), "--threads", str(args.threads)]

    sft_model = args.sft_model
    if not sft_model:
        _run([*lmpo, "train", "cpt", "--out", str(out / "cpt"), *common])
        _run([*lmpo, "train", "sft", "--model", str(out / "cpt" / "model"), "--out", str(out / "sft"), *common])
        sft_model = str(out / "sft" / "model")
    before = _sft_accuracy(Path(sft_model))

    rows = []
    for name in args.presets.split(","):
        run_dir = out / name
        started = time.perf_counter()
        code = _run([*lmpo, "train", name, "--model", sft_model, "--out", str(run_dir), "--steps", str(args.steps),
                     "--eval_every", str(args.steps), "--save_every", "0", *common], check=False)
        wall = time.perf_counter() - started
        if code != 0:
            rows.append({"preset": name, "error": f"exit code {code}; see {run_dir}/log.txt", "seconds": round(wall, 1)})
            continue
        result = json.loads((run_dir / "result.json").read_text())
        held = result["models_held"]
        rows.append({"preset": name, "before": before, "after": result["accuracy"],
                     "gain_points": round(100 * (result["accuracy"] - before), 1), "seconds": round(result["seconds"], 1),
                     "peak_rss_mb": result["peak_rss_mb"],
                     "models": f"policy / {'reference' if held['reference'] else '-'} / "
                               f"{ {'none': '-', 'head': 'value head', 'separate': 'critic'}[held['critic']] }",
                     "source": RL_PRESETS[name].source})
    table = _table(rows, args.steps)
    (out / "table.md").write_text(table)
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    print(table)
    print(json.dumps({"steps": args.steps, "sft_accuracy": before,
                      "results": {r["preset"]: r.get("gain_points", r.get("error")) for r in rows}}))


def _run(cmd: list[str], check: bool = True) -> int:
    print("$", " ".join(cmd), flush=True)
    log_dir = Path(cmd[cmd.index("--out") + 1])
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "log.txt", "w") as log:
        code = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    if check and code != 0:
        sys.exit(f"failed ({code}): {' '.join(cmd)}; see {log_dir / 'log.txt'}")
    return code


def _sft_accuracy(model_dir: Path) -> float:
    result = model_dir.parent / "result.json"
    if result.is_file() and json.loads(result.read_text()).get("accuracy") is not None:
        return json.loads(result.read_text())["accuracy"]
    from lmpo.envs import make_task
    from lmpo.rollout.evaluation import evaluate
    from lmpo.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(str(model_dir))
    task = make_task("sort_digits")
    return evaluate(model, tok, task, task.heldout_problems(500)).accuracy


def _table(rows: list[dict], steps: int) -> str:
    lines = [f"Held-out greedy accuracy (500 problems) after {steps} RL steps from the same SFT checkpoint.", "",
             "| preset | before | after | gain (points) | wall time (s) | peak RSS (MB) | models held (policy / reference / critic) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['preset']} | failed: {r['error']} | | | {r['seconds']} | | |")
        else:
            lines.append(f"| {r['preset']} | {100 * r['before']:.1f}% | {100 * r['after']:.1f}% | {r['gain_points']:+.1f} | "
                         f"{r['seconds']} | {r['peak_rss_mb']:.0f} | {r['models']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
