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
from lmpo.teach.compare.plan import (DEFAULT_METHODS, CompareConfig, Method, budget_samples, held_words,
                                     plan_method, reference_note, refused)
from lmpo.teach.compare.records import RunRecord, read_run
from lmpo.teach.compare.render import Comparison, print_table, write_all
from lmpo.teach.compare.summary import Spread, recommend, summarise
from lmpo.teach.compare.texts import tx
from lmpo.teach.refusals import ready_out, said
from lmpo.trainers.run_dir import lock_directory

__all__ = ["CompareConfig", "Comparison", "DEFAULT_METHODS", "run_compare", "collect", "RunRecord"]


def start_model(cfg: CompareConfig, seed: int, say: Callable[[str], None]) -> tuple[str, float | None]:
    """(The starting model directory of `seed`, its held-out accuracy when known)."""
    if cfg.start:
        return cfg.start, None
    from lmpo.teach.start import sft_start

    point = sft_start(task=cfg.task, seed=seed, threads=cfg.threads, model=cfg.model)
    say(tx("sft_start", cfg.lang, seed=seed, model_dir=point.model_dir, accuracy=100 * point.sft_accuracy))
    return point.model_dir, point.sft_accuracy


def run_compare(cfg: CompareConfig, command: str = "", quiet: bool = False) -> Comparison:
    """Run every (method, seed) not yet finished, then write the table, plots and page to cfg.out."""
    cfg.validate()
    say = (lambda text: None) if quiet else (lambda text: print(f"[compare] {text}", flush=True))
    lang = cfg.lang
    methods = [Method.parse(name, lang) for name in cfg.method_names()]
    problems = []
    for method in methods:  # every method's arithmetic before the first run spends minutes
        try:
            plan_method(cfg, method, cfg.seed_list()[0])
        except ValueError as err:
            problems.append(str(err).removeprefix(refused([], lang)))
    if problems:
        raise ValueError(refused(problems, lang))
    if cfg.start and not Path(cfg.start).is_dir():
        raise FileNotFoundError(tx("no_start_dir", lang, start=cfg.start))
    try:  # what loading would refuse, before the first run is launched
        check_model_source(cfg.start or cfg.model)
    except FileNotFoundError as err:
        text = said(err, lang) or str(err)
        raise FileNotFoundError(tx("bad_start", lang, error=text) if cfg.start else text) from None
    ready_out(cfg.out, lang)  # in explain's and factcheck's words, before any model is trained
    refuse_changed_runs(cfg, methods)
    lock_directory(cfg.out)  # a second compare over this --out would delete the runs in progress as "killed"
    starts: dict[int, float | None] = {}
    for seed in cfg.seed_list():
        specs = [RunSpec(cfg, method, seed, "") for method in methods]
        if all(spec.finished for spec in specs):
            say(tx("seed_kept", lang, seed=seed, dir=Path(cfg.out) / f"seed{seed}"))
            continue
        model_dir, starts[seed] = start_model(cfg, seed, say)  # trained only when a run needs it
        for method in methods:
            spec = RunSpec(cfg, method, seed, model_dir)
            plan = spec.plan()
            if spec.finished:
                say(tx("run_kept", lang, seed=seed, method=method.name, dir=spec.stage_dir))
                continue
            cap = tx("run_cap", lang, minutes=cfg.minutes) if cfg.budget == "time" else ""
            say(tx("run_start", lang, seed=seed, method=method.name, amount=plan.amount, cap=cap,
                   log=spec.run_dir / "log.txt"))
            launch(spec, lambda line, m=method.name, s=seed: say(tx("run_line", lang, seed=s, method=m, line=line)))
            record = read_run(spec.stage_dir, method.name, seed, method.stage)
            if record.no_steps:
                say(tx("run_no_steps", lang, seed=seed, method=method.name, seconds=record.seconds,
                       stopped=record.stopped))
                continue
            lost = tx("run_lost", lang, seconds=record.abandoned_seconds) if record.abandoned_seconds else ""
            say(tx("run_done", lang, seed=seed, method=method.name, accuracy=100 * (record.accuracy or 0),
                   seconds=record.seconds, lost=lost, mb=record.peak_rss_mb))
    comparison = collect(cfg, command, starts)
    files = write_all(comparison, Path(cfg.out))
    if not quiet:
        print_table(comparison, Path(cfg.out))
        print(tx("files", lang, md=files["md"], json=files["json"], html=files["html"]))
    return comparison


RUN_IDENTITY = ("methods", "seeds", "out", "lang")
"""Options that choose which runs a comparison holds, not how a run trains: they may change
between invocations over one --out (add a method or a seed to a finished comparison); and the
language the comparison is told in (a run's spec.json from before --lang has none)."""


def refuse_changed_runs(cfg: CompareConfig, methods: list[Method]) -> None:
    """Refuse to keep finished runs that another configuration trained: `--samples 8000` over an
    --out whose runs used 4000 would otherwise report the 4000-sample runs under the 8000 header."""
    problems, lang = [], cfg.lang
    for seed in cfg.seed_list():
        for method in methods:
            spec = RunSpec(cfg, method, seed, "")
            if not spec.finished or not (spec.run_dir / SPEC).is_file():
                continue
            saved = json.loads((spec.run_dir / SPEC).read_text())["config"]
            now = json.loads(spec.to_json())["config"]
            changed = [tx("changed_option", lang, option=k, saved=saved.get(k), now=v) for k, v in now.items()
                       if k not in RUN_IDENTITY and saved.get(k) != v]
            if changed:
                problems.append(tx("changed_run", lang, dir=spec.run_dir, changed=", ".join(changed)))
    if problems:
        more = tx("changed_more", lang, n=len(problems) - 3) if len(problems) > 3 else ""
        raise ValueError(tx("changed_runs", lang, out=cfg.out, runs=tx("joiner", lang).join(problems[:3]), more=more))


def collect(cfg: CompareConfig, command: str = "", start_accuracy: dict[int, float | None] | None = None) -> Comparison:
    """The comparison of the finished runs under cfg.out (every (method, seed) must be finished)."""
    seeds, methods = cfg.seed_list(), [Method.parse(name, cfg.lang) for name in cfg.method_names()]
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
        summaries.append(summarise(method.name, mine, held_words(plan), reference_note(plan), plan.amount,
                                   plan.what_counts))
    budget = {"kind": cfg.budget, "samples": budget_samples(cfg)}
    if cfg.budget == "time":
        budget["minutes"] = cfg.minutes
    label = tx("label.start" if cfg.start else "label.sft", cfg.lang)
    return Comparison(command, cfg.task, budget, seeds, start, summaries,
                      recommend(summaries, start, cfg.budget, start_label=label, minutes=cfg.minutes, lang=cfg.lang),
                      records, label, cfg.lang)
