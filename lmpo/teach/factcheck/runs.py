"""Training runs that claims read, each trained once per factcheck, from the SFT start.

Every run is the real trainer (`train_rl`, ...) with the pipeline's settings for its stage and a
small budget; what a claim needs to see inside one (the reference model) is captured by
wrapping the trainer's own method for the duration of the run, never by a copy of the loop."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lmpo.reports.metrics import kept_rows, read_metrics
from lmpo.teach.factcheck.context import Context

RL_STEPS = 60
"""Steps of each short RL run (8 prompts x 8 samples each, the pipeline's batch)."""
EVAL_PROBLEMS = 500
"""Held-out problems, evaluated greedily at the start and the end of a run."""


@dataclass
class RLRun:
    """A finished RL run: its metrics rows, result.json, and what was seen of its reference."""

    out: Path
    rows: list[dict]
    result: dict
    reference: dict[str, Any] = field(default_factory=dict)

    def series(self, key: str) -> list[float]:
        return [float(r[key]) for r in self.rows if key in r and "reward_mean" in r]

    def evals(self) -> list[float]:
        return [float(r["eval_accuracy"]) for r in self.rows if "eval_accuracy" in r]


def rl_run(ctx: Context, name: str, preset: str = "grpo", **overrides: Any) -> RLRun:
    """`lmpo pipeline --rl PRESET`'s RL stage from the SFT start, `RL_STEPS` steps (unless
    overridden), held-out accuracy at the start and the end. The run is `NAME_seedS`, S the seed it
    trains with (`seed=` in the overrides, else the factcheck's): claims that share a run by name
    share one trained with the same seed."""
    name = f"{name}_seed{overrides.get('seed', ctx.seed)}"

    def train() -> RLRun:
        from lmpo.trainers.rl import train_rl

        options = {"steps": RL_STEPS, "eval_problems": EVAL_PROBLEMS, "save_every": 0, "save_trajectories": 0,
                   **overrides}
        options.setdefault("eval_every", options["steps"])
        cfg = ctx.stage("rl", name, preset, **options)
        with ctx.quiet(name), _captured_references() as references:
            train_rl(cfg)
        out = Path(cfg.out)
        run = RLRun(out, kept_rows(read_metrics(out / "metrics.jsonl")), json.loads((out / "result.json").read_text()))
        if references:
            run.reference = reference_figures(references[0], cfg.model, out / "model")
        return run

    return ctx.once(f"rl:{name}", train)


@contextlib.contextmanager
def _captured_references():
    """The models `Run.reference` hands to the trainer, kept for inspection after the run."""
    from lmpo.trainers.harness import Run

    captured: list = []
    original = Run.reference

    def reference(self, policy, load):
        model = original(self, policy, load)
        captured.append(model)
        return model

    Run.reference = reference
    try:
        yield captured
    finally:
        Run.reference = original


def reference_figures(reference: torch.nn.Module, start_dir: str, final_dir: Path) -> dict[str, Any]:
    """Whether the reference could have learnt (requires_grad, .grad), and how far its weights
    and the policy's final weights are from the starting checkpoint's."""
    start = _weights(Path(start_dir))
    final = _weights(final_dir)
    params = dict(reference.named_parameters())
    return {"reference_params": len(params),
            "reference_requires_grad": sum(p.requires_grad for p in params.values()),
            "reference_grads": sum(p.grad is not None for p in params.values()),
            "reference_max_change": _max_change(start, {k: p.detach().cpu() for k, p in params.items()}),
            "policy_max_change": _max_change(start, final)}


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


def _max_change(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    common = [k for k in before if k in after]
    if not common:
        raise ValueError("no parameter names in common between the checkpoint and the model")
    return max(float((before[k].float() - after[k].float()).abs().max()) for k in common)


def mean_of(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def tail_mean(xs: list[float], share: float = 1 / 3) -> float:
    """Mean of the last `share` of a series (at least one point)."""
    k = max(1, int(len(xs) * share))
    return mean_of(xs[-k:])


def head_mean(xs: list[float], share: float = 1 / 3) -> float:
    k = max(1, int(len(xs) * share))
    return mean_of(xs[:k])
