"""`lmpo exercise train`: a short run with the user's function plugged into its stage, and the same
run with the library's function, both from the task's SFT checkpoint (`sft_start`)."""

from __future__ import annotations

import json
import time
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable

from lmpo.teach.exercise.core import Exercise
from lmpo.teach.exercise.lang import ljust, msg, rjust, tr
from lmpo.teach.exercise.lang import width as text_width
from lmpo.teach.exercise.plug import Plug, plugged

PAIRS_PER_STEP = 32  # the DPO stage's batch size: --steps N trains on N × 32 pairs
STEP_METRICS = ("reward_mean", "loss", "policy_loss", "kl", "margin", "grad_norm", "eval_accuracy")
"""What the two runs are compared on step by step: what training computed, never a timing."""
STEP_RTOL, STEP_ATOL = 1e-5, 1e-7


@dataclass(frozen=True)
class TrainOptions:
    steps: int = 60
    """Optimizer steps of each run (RL: rollout batches; DPO: batches of 32 pairs)."""
    seed: int = 0
    """Seed of both runs and of the SFT starting checkpoint."""
    out: str = "runs/exercise"
    """Directory of the runs: OUT/yours and OUT/lmpo."""
    threads: int = 1
    """Torch CPU threads."""
    eval_problems: int = 500
    """Held-out problems evaluated before and after each run."""
    task: str = "sort_digits"
    """The task of the runs and of the SFT checkpoint."""

    def validate(self, lang: str = "en") -> None:
        from lmpo.teach.refusals import refusal

        if self.steps < 1:
            raise ValueError(refusal("exercise.steps", lang, value=self.steps))
        if self.eval_problems < 1:
            raise ValueError(refusal("exercise.eval_problems", lang, value=self.eval_problems))
        if self.threads < 0:
            raise ValueError(refusal("exercise.threads", lang, value=self.threads))


@dataclass(frozen=True)
class RunFigures:
    """Held-out accuracy of one run, before (its step-0 evaluation) and after training."""

    label: str
    before: float
    after: float
    seconds: float
    run_dir: str
    steps: dict[int, dict[str, float]] = field(default_factory=dict)
    """Per step, the `STEP_METRICS` its metrics rows recorded."""


def stage_settings(plug: Plug, name: str, model_dir: str, out: Path, opts: TrainOptions) -> tuple[str, dict]:
    """(stage kind, config values) of one run with the function registered under `name`."""
    from lmpo.trainers.presets import rl_preset, task_settings

    settings = dict(plug.settings)
    common = {"model": model_dir, "out": str(out), "task": opts.task, "seed": opts.seed, "threads": opts.threads,
              "eval_problems": opts.eval_problems, "save_every": 0, plug.option: name}
    if plug.stage == "rl":
        preset = rl_preset(settings.pop("preset", "grpo")).settings
        return "rl", {**task_settings(opts.task, "rl"), **preset, **settings, **common, "steps": opts.steps,
                      "eval_every": opts.steps}
    if plug.stage == "dpo":
        return "dpo", {**task_settings(opts.task, "dpo"), **settings, **common, "batch_size": PAIRS_PER_STEP,
                       "pairs": opts.steps * PAIRS_PER_STEP, "epochs": 1}
    raise ValueError(f"unknown stage {plug.stage!r}")


def run_stage(kind: str, values: dict, label: str):
    """Train one stage; the result and the step-0 held-out accuracy from its metrics."""
    if kind == "rl":
        from lmpo.trainers.rl import train_rl
        from lmpo.trainers.rl_config import RLConfig as Config

        train = train_rl
    else:
        from lmpo.trainers.preference import PreferenceConfig as Config
        from lmpo.trainers.preference import train_preference as train
    known = {f.name for f in fields(Config)}
    started = time.perf_counter()
    result = train(Config(**{k: v for k, v in values.items() if k in known}))
    return RunFigures(label, step0_accuracy(Path(result.run_dir)), float(result.accuracy or 0.0),
                      time.perf_counter() - started, result.run_dir, step_metrics(Path(result.run_dir)))


def step_metrics(run_dir: Path) -> dict[int, dict[str, float]]:
    steps: dict[int, dict[str, float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if isinstance(row.get("step"), int):
            found = {k: float(row[k]) for k in STEP_METRICS if isinstance(row.get(k), (int, float))}
            steps.setdefault(row["step"], {}).update(found)
    return steps


def first_step_difference(yours: RunFigures, reference: RunFigures) -> dict | None:
    """The first step metric on which the runs differ beyond float tolerance (or a step only one
    of them recorded), as message fields; None when every step agrees."""
    for step in sorted(set(yours.steps) | set(reference.steps)):
        mine, ref = yours.steps.get(step), reference.steps.get(step)
        if mine is None or ref is None:
            return {"metric": "step", "step": step, "yours": "—" if mine is None else "✓",
                    "ref": "—" if ref is None else "✓"}
        for key in STEP_METRICS:
            if key in mine and key in ref and abs(mine[key] - ref[key]) > STEP_ATOL + STEP_RTOL * abs(ref[key]):
                return {"metric": key, "step": step, "yours": f"{mine[key]:.6g}", "ref": f"{ref[key]:.6g}"}
    return None


def step0_accuracy(run_dir: Path) -> float:
    """The held-out accuracy a run measured before its first update (its step-0 metrics row)."""
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("step") == 0 and "eval_accuracy" in row:
            return float(row["eval_accuracy"])
    raise ValueError(f"{run_dir / 'metrics.jsonl'}: no step-0 evaluation")


def train_exercise(exercise: Exercise, fn: Callable, opts: TrainOptions, model_dir: str | None = None,
                   say: Callable[[str], None] = print, lang: str = "en") -> list[RunFigures]:
    """Run the exercise's stage with `fn` plugged in, then with the library's function; the registry
    is left as it was. `model_dir` defaults to the task's SFT checkpoint for `opts.seed`; what it says
    is in `lang`."""
    opts.validate()
    plug: Plug = exercise.plug
    out = Path(opts.out)
    if model_dir is None:
        model_dir = _start_model(opts, out, say, lang)
    wrapped = plug.wrap(fn) if plug.wrap else fn
    say(msg("train.start", lang, name=exercise.name, function=exercise.function, role=tr(plug.role, lang),
            steps=opts.steps, model_dir=model_dir))
    own = None if not plug.own_name else plug.reference
    with plugged(plug.registry, wrapped, own, stem=f"your_{exercise.function}") as name:
        kind, values = stage_settings(plug, name, model_dir, out / "yours", opts)
        yours = _run_said(kind, values, msg("train.yours", lang), out / "yours.log", say, lang, opts.steps)
    say(msg("train.reference", lang, reference=plug.reference))
    kind, values = stage_settings(plug, plug.reference, model_dir, out / "lmpo", opts)
    reference = _run_said(kind, values, f"lmpo {plug.reference}", out / "lmpo.log", say, lang, opts.steps)
    return [yours, reference]


def _start_model(opts: TrainOptions, out: Path, say: Callable[[str], None], lang: str) -> str:
    """The task's SFT checkpoint (`sft_start`); in Chinese, a first-time training of it logs to
    OUT/sft_start.log instead of the terminal, said in one Chinese line."""
    from lmpo.teach.start import is_cached, sft_start, start_directory

    train = lambda: sft_start(opts.task, seed=opts.seed, threads=opts.threads or 2).model_dir  # noqa: E731
    if lang == "en" or is_cached(opts.task, opts.seed):
        return train()
    log = out / "sft_start.log"
    say(msg("train.sft_start", lang, directory=start_directory(opts.task, opts.seed, "tiny"), log=log))
    out.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as sink, redirect_stdout(sink), redirect_stderr(sink):
        return train()


def _run_said(kind: str, values: dict, label: str, log: Path, say: Callable[[str], None], lang: str,
              steps: int) -> RunFigures:
    """`run_stage`; in Chinese, with the trainer's own English lines written to `log` instead of the
    terminal (its format is every command's), and a line in Chinese before and after."""
    if lang == "en":
        return run_stage(kind, values, label)
    say(msg("train.quiet", lang, steps=steps, log=log))
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as sink, redirect_stdout(sink), redirect_stderr(sink):
        figures = run_stage(kind, values, label)
    say(msg("train.done", lang, seconds=f"{figures.seconds:.1f}",
            accuracy=f"{100 * figures.before:.1f}% → {100 * figures.after:.1f}%"))
    return figures


def figures_table(runs: list[RunFigures], lang: str = "en") -> str:
    say = lambda key: msg(key, lang)  # noqa: E731
    width = max(text_width(say("table.run")), *(text_width(r.label) for r in runs))
    lines = [f"{ljust(say('table.run'), width)} {rjust(say('table.accuracy'), 20)} {rjust(say('table.time'), 9)}  "
             f"{say('table.dir')}"]
    for r in runs:
        change = f"{100 * r.before:.1f}% → {100 * r.after:.1f}%"
        lines.append(f"{ljust(r.label, width)} {change:>20} {r.seconds:>9.1f}  {r.run_dir}")
    return "\n".join(lines)


CLOSE_POINTS = 0.05
"""Gains (as fractions) within this of each other read as close."""


def _reading(yours: RunFigures, reference: RunFigures) -> str:
    """How the two runs compare: same_accuracy, no_learning, close or different."""
    gain, ref_gain = yours.after - yours.before, reference.after - reference.before
    if abs(yours.after - reference.after) < 1e-9:
        return "same_accuracy"
    if gain <= 0 < ref_gain:
        return "no_learning"
    return "close" if abs(gain - ref_gain) <= CLOSE_POINTS else "different"


def runs_indistinguishable(yours: RunFigures, reference: RunFigures) -> bool:
    """Whether the figures cannot tell the runs apart (same final accuracy, or gains close)."""
    return _reading(yours, reference) in ("same_accuracy", "close")


def verdict(yours: RunFigures, reference: RunFigures, lang: str = "en") -> str:
    """A plain reading of the two runs (accuracies are deterministic for a seed)."""
    gain, ref_gain = yours.after - yours.before, reference.after - reference.before
    reading = _reading(yours, reference)
    if reading == "same_accuracy":
        differs = first_step_difference(yours, reference)
        return msg("verdict.same", lang) if differs is None else msg("verdict.same_accuracy", lang, **differs)
    points = {"gain": f"{100 * gain:+.1f}", "ref_gain": f"{100 * ref_gain:+.1f}"}
    if reading == "no_learning":
        return msg("verdict.no_learning", lang, **points)
    return msg("verdict.compare", lang, closeness=msg(f"verdict.{reading}", lang), **points)


def failed_note(yours: RunFigures, reference: RunFigures, steps: int, lang: str = "en") -> str:
    """What to make of the figures of a function that failed the check: the "too few steps" hedge
    only where the figures do not already tell the runs apart."""
    if runs_indistinguishable(yours, reference):
        return msg("train.failed_note_alike", lang, steps=steps)
    return msg("train.failed_note", lang)
