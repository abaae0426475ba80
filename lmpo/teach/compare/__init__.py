"""`lmpo compare`: PPO, GRPO, DPO, online DPO (and any RL preset or DPO loss) from the same SFT
checkpoint per seed, at a matched budget of samples or wall time; a table of held-out accuracy
(mean ± std over seeds), wall time, peak memory, models held and samples used, two plots, an
HTML page, and a recommendation computed from those numbers.

plan: each method's configuration at the budget; execute: the runs, one process each, resumable;
records: what a run measured; summary: the table's figures and the recommendation; render: the
files and the terminal table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from lmpo.models import check_model_source
from lmpo.teach.compare.execute import SPEC, RunSpec, launch
from lmpo.teach.compare.plan import (DEFAULT_METHODS, CompareConfig, Method, budget_samples, models_held,
                                     plan_method, reference_note)
from lmpo.teach.compare.records import RunRecord, read_run
from lmpo.teach.compare.render import Comparison, print_table, write_all
from lmpo.teach.compare.summary import Spread, recommend, summarise
from lmpo.trainers.fs_faults import ready_dir
from lmpo.trainers.run_dir import lock_directory

__all__ = ["CompareConfig", "Comparison", "DEFAULT_METHODS", "run_compare", "collect", "RunRecord"]


def start_model(cfg: CompareConfig, seed: int, say: Callable[[str], None]) -> tuple[str, float | None]:
    """(The starting model directory of `seed`, its held-out accuracy when known)."""
    if cfg.start:
        return cfg.start, None
    from lmpo.teach.start import sft_start

    point = sft_start(task=cfg.task, seed=seed, threads=cfg.threads, model=cfg.model)
    say(f"seed {seed}: SFT start {point.model_dir} (held-out accuracy {100 * point.sft_accuracy:.1f}%)")
    return point.model_dir, point.sft_accuracy


def run_compare(cfg: CompareConfig, command: str = "", quiet: bool = False) -> Comparison:
    """Run every (method, seed) not yet finished, then write the table, plots and page to cfg.out."""
    cfg.validate()
    say = (lambda text: None) if quiet else (lambda text: print(f"[compare] {text}", flush=True))
    methods = [Method.parse(name) for name in cfg.method_names()]
    problems = []
    for method in methods:  # every method's arithmetic before the first run spends minutes
        try:
            plan_method(cfg, method, cfg.seed_list()[0])
        except ValueError as err:
            problems.append(str(err).removeprefix("compare: "))
    if problems:
        raise ValueError("compare: " + "; ".join(problems))
    if cfg.start and not Path(cfg.start).is_dir():
        raise FileNotFoundError(f"--start {cfg.start}: no such model directory")
    try:  # what loading would refuse, before the first run is launched
        check_model_source(cfg.start or cfg.model)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"--start: {err}" if cfg.start else str(err)) from None
    ready_dir(cfg.out)  # in explain's and factcheck's words, before any model is trained
    refuse_changed_runs(cfg, methods)
    lock_directory(cfg.out)  # a second compare over this --out would delete the runs in progress as "killed"
    starts: dict[int, float | None] = {}
    for seed in cfg.seed_list():
        specs = [RunSpec(cfg, method, seed, "") for method in methods]
        if all(spec.finished for spec in specs):
            say(f"seed {seed}: every method finished earlier, kept ({Path(cfg.out) / f'seed{seed}'})")
            continue
        model_dir, starts[seed] = start_model(cfg, seed, say)  # trained only when a run needs it
        for method in methods:
            spec = RunSpec(cfg, method, seed, model_dir)
            plan = spec.plan()
            if spec.finished:
                say(f"seed {seed} {method.name}: finished earlier, kept ({spec.stage_dir})")
                continue
            say(f"seed {seed} {method.name}: {plan.amount} samples"
                f"{f', at most {cfg.minutes:g} min' if cfg.budget == 'time' else ''}; log {spec.run_dir / 'log.txt'}")
            launch(spec, lambda line, m=method.name, s=seed: say(f"seed {s} {m}: {line}"))
            record = read_run(spec.stage_dir, method.name, seed, method.stage)
            if record.no_steps:
                say(f"seed {seed} {method.name}: trained 0 steps in {record.seconds:.1f} s: {record.stopped}; it "
                    f"counts as the start model, and the other methods are compared on (raise --minutes to train it)")
                continue
            lost = (f" (and {record.abandoned_seconds:.0f} s on steps a rollback abandoned, not counted, as their "
                    f"samples are not)" if record.abandoned_seconds else "")
            say(f"seed {seed} {method.name}: held-out accuracy {100 * (record.accuracy or 0):.1f}%, "
                f"{record.seconds:.0f} s{lost}, peak {record.peak_rss_mb} MB")
    comparison = collect(cfg, command, starts)
    files = write_all(comparison, Path(cfg.out))
    if not quiet:
        print_table(comparison, Path(cfg.out))
        print(f"files: {files['md']}, {files['json']}, {files['html']}")
    return comparison


RUN_IDENTITY = ("methods", "seeds", "out")
"""Options that choose which runs a comparison holds, not how a run trains: they may change
between invocations over one --out (add a method or a seed to a finished comparison)."""


def refuse_changed_runs(cfg: CompareConfig, methods: list[Method]) -> None:
    """Refuse to keep finished runs that another configuration trained: `--samples 8000` over an
    --out whose runs used 4000 would otherwise report the 4000-sample runs under the 8000 header."""
    problems = []
    for seed in cfg.seed_list():
        for method in methods:
            spec = RunSpec(cfg, method, seed, "")
            if not spec.finished or not (spec.run_dir / SPEC).is_file():
                continue
            saved = json.loads((spec.run_dir / SPEC).read_text())["config"]
            now = json.loads(spec.to_json())["config"]
            changed = [f"{k} {saved.get(k)!r} (now {v!r})" for k, v in now.items()
                       if k not in RUN_IDENTITY and saved.get(k) != v]
            if changed:
                problems.append(f"{spec.run_dir}: {', '.join(changed)}")
    if problems:
        raise ValueError(f"--out {cfg.out} holds finished runs made with other options, which this comparison "
                         f"would report as its own: {'; '.join(problems[:3])}"
                         f"{f' (and {len(problems) - 3} more)' if len(problems) > 3 else ''}. Use another --out, "
                         f"or delete those runs to train them again")


def collect(cfg: CompareConfig, command: str = "", start_accuracy: dict[int, float | None] | None = None) -> Comparison:
    """The comparison of the finished runs under cfg.out (every (method, seed) must be finished)."""
    seeds, methods = cfg.seed_list(), [Method.parse(name) for name in cfg.method_names()]
    by_method = {method: [read_run(RunSpec(cfg, method, seed, "").stage_dir, method.name, seed, method.stage)
                          for seed in seeds] for method in methods}
    records = [r for mine in by_method.values() for r in mine]
    known = start_accuracy or {}
    # the start's accuracy per seed: as the runs measured it before training (the evaluation their
    # final figures come from), else as the SFT stage measured it
    starts = {seed: next((r.start_accuracy for r in records if r.seed == seed and r.start_accuracy is not None),
                         known.get(seed)) for seed in seeds}
    start = Spread.of(list(starts.values()))
    for record in records:
        if record.no_steps:  # trained nothing: the model it would hand on is the start model
            record.accuracy = starts[record.seed]
    summaries = []
    for method, mine in by_method.items():
        plan = plan_method(cfg, method, seeds[0])
        summaries.append(summarise(method.name, mine, models_held(plan), reference_note(plan), plan.amount,
                                   plan.what_counts))
    budget = {"kind": cfg.budget, "samples": budget_samples(cfg)}
    if cfg.budget == "time":
        budget["minutes"] = cfg.minutes
    label = "start model" if cfg.start else "SFT start"
    return Comparison(command, cfg.task, budget, seeds, start, summaries,
                      recommend(summaries, start, cfg.budget, start_label=label, minutes=cfg.minutes), records, label)
