"""What one finished (method, seed) run measured, read back from its files: `result.json`
(held-out accuracy, wall time, peak memory) and `metrics.jsonl` (samples, tokens, and the
held-out evaluations along the way, each with the samples used and the seconds elapsed)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from lmpo.reports.metrics import as_float, kept_rows, read_metrics

NO_STEPS = "no_steps.json"
"""Written in a run's directory, in place of its stage's result.json, by a run whose reference
log-prob pass (offline DPO, KTO) alone used up the time budget: it trained 0 steps and wrote no
model, which at that budget is its result (`lmpo.teach.compare.execute`)."""


@dataclass
class EvalPoint:
    samples: int
    seconds: float | None
    accuracy: float


@dataclass
class RunRecord:
    method: str
    seed: int
    accuracy: float | None
    seconds: float
    peak_rss_mb: float | None
    samples: int
    completion_tokens: int
    run_dir: str
    start_accuracy: float | None = None
    """The held-out accuracy of the starting model, as this run evaluated it before training."""
    peak_gpu_mb: float | None = None
    stopped: str | None = None
    curve: list[EvalPoint] = field(default_factory=list)
    no_steps: bool = False
    """It trained 0 steps within the budget (NO_STEPS): its accuracy is the start model's."""
    abandoned_seconds: float = 0.0
    """Wall time spent on steps that a collapse-guard rollback abandoned: left out of `seconds` (and
    of the curve's), as their samples are left out of `samples`."""


def read_run(stage_dir: Path, method: str, seed: int, stage: str) -> RunRecord:
    """The record of a finished run in `stage_dir` (a dpo, online_dpo or RL stage directory)."""
    if (stage_dir.parent / NO_STEPS).is_file():
        return _no_steps_record(stage_dir, method, seed)
    result = json.loads((stage_dir / "result.json").read_text())
    logged, abandoned_s = on_kept_clock(read_metrics(stage_dir / "metrics.jsonl"))
    rows = kept_rows(logged)  # not the steps a rollback abandoned, as their samples and seconds are not counted
    config = result.get("config", {})
    if stage == "dpo":
        samples_at, tokens = _pair_counts(result, config, rows)
    elif stage == "online_dpo":
        samples_at, tokens = _round_counts(rows)
    else:
        samples_at, tokens = _step_counts(rows, config)
    evals = [row for row in rows if isinstance(row.get("eval_accuracy"), (int, float))]
    curve = [EvalPoint(samples_at(row), row.get("elapsed_s"), float(row["eval_accuracy"])) for row in evals]
    first = next((float(row["eval_accuracy"]) for row in evals if row.get("step") == 0), None)  # before training
    return RunRecord(method=method, seed=seed, accuracy=result.get("accuracy"),
                     seconds=float(result["seconds"]) - abandoned_s, abandoned_seconds=abandoned_s,
                     peak_rss_mb=result.get("peak_rss_mb"), peak_gpu_mb=result.get("peak_gpu_mb"),
                     samples=samples_at(None), completion_tokens=tokens, run_dir=str(stage_dir),
                     start_accuracy=first, stopped=next((r["stopped"] for r in rows if "stopped" in r), None),
                     curve=curve)


def on_kept_clock(rows: list[dict]) -> tuple[list[dict], float]:
    """The rows with each `elapsed_s` less the wall time of the branches that rollbacks abandoned
    before it, and that time in all. A rollback row says when it came (`elapsed_s`) and the clock
    of the checkpoint it went back to (`to_elapsed_s`); a later rollback to an earlier checkpoint
    abandons an earlier one's span again, so the spans are merged, not summed. Runs logged before
    rollbacks said their clock lose nothing."""
    spans = sorted((to, at) for r in rows if "rollback" in r
                   and (to := as_float(r.get("to_elapsed_s"))) is not None
                   and (at := as_float(r.get("elapsed_s"))) is not None and at > to)
    merged: list[list[float]] = []
    for to, at in spans:
        if merged and to <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], at)
        else:
            merged.append([to, at])

    def lost(t: float) -> float:
        return sum(min(at, t) - to for to, at in merged if to < t)

    out = [dict(r, elapsed_s=t - lost(t)) if "rollback" not in r and (t := as_float(r.get("elapsed_s"))) is not None
           else r for r in rows]
    return out, lost(math.inf)


def _no_steps_record(stage_dir: Path, method: str, seed: int) -> RunRecord:
    """A run that trained nothing: no samples, its accuracy left for the start model's (`collect`)."""
    saved = json.loads((stage_dir.parent / NO_STEPS).read_text())
    return RunRecord(method=method, seed=seed, accuracy=None, seconds=float(saved["seconds"]),
                     peak_rss_mb=saved.get("peak_rss_mb"), samples=0, completion_tokens=0, run_dir=str(stage_dir),
                     stopped=saved["stopped"], no_steps=True)


def _step_counts(rows: list[dict], config: dict):
    """RL: every step row says how many prompts it sampled (`groups_sampled`, more than
    prompts_per_step under dynamic sampling); each had group_size completions."""
    group = int(config.get("group_size", 1))
    steps = [row for row in rows if "groups_sampled" in row]
    cumulative: dict[int, int] = {}
    total = 0
    for row in steps:
        total += int(row["groups_sampled"]) * group
        cumulative[int(row["step"])] = total
    tokens = sum(float(row.get("completion_len_mean", 0.0)) * config.get("prompts_per_step", 0) * group
                 for row in steps)

    def samples_at(row: dict | None) -> int:
        return total if row is None else cumulative.get(int(row.get("step", 0)), 0)

    return samples_at, round(tokens)


def _round_counts(rows: list[dict]):
    """Online DPO: every round row says how many completions it sampled and their tokens."""
    rounds = [row for row in rows if "round" in row]
    cumulative: dict[int, int] = {}
    total = 0
    for row in rounds:
        total += int(row.get("samples", 0))
        cumulative[int(row["round"])] = total

    def samples_at(row: dict | None) -> int:
        return total if row is None else cumulative.get(int(row.get("round", 0)), 0)

    return samples_at, sum(int(row.get("completion_tokens", 0)) for row in rounds)


def _pair_counts(result: dict, config: dict, rows: list[dict]):
    """Offline DPO: two completions per pair trained on; its evaluations are at the start and
    the end (the end's step trained `pairs_trained` pairs)."""
    pairs = int(result.get("pairs_trained", config.get("pairs", 0)))
    batch = int(config.get("batch_size", 1))

    def samples_at(row: dict | None) -> int:
        if row is None:
            return 2 * pairs
        return 2 * min(pairs, int(row.get("step", 0)) * batch)

    return samples_at, int(result.get("completion_tokens", 0))
