"""From one SFT checkpoint: a reward model's held-out pairwise accuracy, then PPO driven only by
that reward model, offline DPO, KTO, ORPO, online DPO, rejection-sampling fine-tuning, and PPO
with and without a pre-training loss mixed in (PPO-ptx), each with the commands' defaults, side
by side.

    .venv/bin/python bench/preferences.py [--sft-model DIR] [--only dpo,kto] [--out bench/results/preferences]

Without --sft-model it first runs CPT and SFT (the pipeline's defaults). Each method runs in its
own process (`lmpo train ...`). Writes `OUT/table.md` and `OUT/results.json`, prints the table,
and ends with a JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from rl_presets import _run, _sft_accuracy  # noqa: E402  (same directory)

from lmpo.trainers.presets import PPO_RM_SETTINGS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sft-model", default="")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ppo-steps", type=int, default=150)
    parser.add_argument("--ptx-coef", type=float, default=0.1, help="γ of the PPO-ptx run")
    parser.add_argument("--only", default="", help="comma-separated methods to run (default: all)")
    parser.add_argument("--out", default="bench/results/preferences")
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
    start = ["--model", sft_model, "--save_every", "0", *common]

    ppo_rm = [x for k, v in PPO_RM_SETTINGS.items() for x in (f"--{k}", str(v))]
    ppo = ["train", "ppo", "--steps", str(args.ppo_steps), "--eval_every", "25"]
    runs = {
        "ppo_rm": [*lmpo, *ppo, "--out", str(out / "ppo_rm"), "--rewards", "rm=1.0", "--reward_model",
                   str(out / "rm" / "model"), *ppo_rm, *start],
        "dpo": [*lmpo, "train", "dpo", "--out", str(out / "dpo"), *start],
        "kto": [*lmpo, "train", "kto", "--out", str(out / "kto"), *start],
        "orpo": [*lmpo, "train", "orpo", "--out", str(out / "orpo"), *start],
        "online_dpo": [*lmpo, "train", "online_dpo", "--out", str(out / "online_dpo"), *start],
        "rft": [*lmpo, "train", "rft", "--out", str(out / "rft"), *start],
        "ppo": [*lmpo, *ppo, "--out", str(out / "ppo"), *start],
        "ppo_ptx": [*lmpo, *ppo, "--out", str(out / "ppo_ptx"), "--ptx_coef", str(args.ptx_coef), *start],
    }
    chosen = args.only.split(",") if args.only else ["rm", *runs]
    unknown = set(chosen) - {"rm", *runs}
    if unknown:
        parser.error(f"--only: unknown {sorted(unknown)}; choose from rm, {', '.join(runs)}")
    rows = []
    if "rm" in chosen or "ppo_rm" in chosen:
        _run([*lmpo, "train", "rm", "--out", str(out / "rm"), *start])
        rm = json.loads((out / "rm" / "result.json").read_text())
        rows.append({"method": "reward model", "metric": "held-out pairwise accuracy", "value": rm["accuracy"],
                     "seconds": round(rm["seconds"], 1)})
    for name, cmd in runs.items():
        if name not in chosen:
            continue
        _run(cmd)
        result = json.loads((out / name / "result.json").read_text())
        row = {"method": name, "metric": "held-out task accuracy", "before": before, "value": result["accuracy"],
               "gain_points": round(100 * (result["accuracy"] - before), 1), "seconds": round(result["seconds"], 1)}
        curve = [json.loads(line) for line in open(out / name / "metrics.jsonl")]
        row["eval_curve"] = [(r["step"], r["eval_accuracy"]) for r in curve if "eval_accuracy" in r]
        rows.append(row)
    table = _table(rows)
    (out / "table.md").write_text(table)
    (out / "results.json").write_text(json.dumps(rows, indent=2))
    print(table)
    print(json.dumps({"sft_accuracy": before, "rm_pairwise_accuracy": rows[0]["value"] if "rm" in chosen else None,
                      "gains": {r["method"]: r["gain_points"] for r in rows if "gain_points" in r}}))


def _table(rows: list[dict]) -> str:
    lines = ["| method | metric | before | after | gain (points) | wall time (s) |", "|---|---|---|---|---|---|"]
    for r in rows:
        before = f"{100 * r['before']:.1f}%" if "before" in r else ""
        gain = f"{r['gain_points']:+.1f}" if "gain_points" in r else ""
        lines.append(f"| {r['method']} | {r['metric']} | {before} | {100 * r['value']:.1f}% | {gain} | {r['seconds']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
