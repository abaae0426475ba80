"""`lmpo pipeline`: its options (the stages' sections, what the pipeline owns), the run, the doctor's
reading after each stage, the table at the end, and what an interrupted pipeline leaves."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from lmpo.cli.config import ConfigError, build


def cmd_pipeline(args: argparse.Namespace, flags: dict) -> int:
    from lmpo.trainers.pipeline import run_pipeline

    cfg, explicit = pipeline_options(args.config, flags)
    from lmpo.trainers.distributed import launched_rank
    from lmpo.trainers.preemption import Preempted, Terminated, sigterm_interrupts
    from lmpo.trainers.reference_pass import StoppedBeforeTraining

    one_process = int(os.environ.get("WORLD_SIZE", "1")) == 1  # torchrun: SIGTERM keeps its meaning
    try:
        with sigterm_interrupts(enabled=one_process):
            results = run_pipeline(cfg, explicit=explicit, after_stage=_print_findings, preemptible=one_process)
    except Preempted as stop:
        print(f"lmpo: {stop}; {_pipeline_resume_hint(Path(cfg.out))}", file=sys.stderr)
        return 143  # 128 + SIGTERM, as if the signal had ended it
    except StoppedBeforeTraining as stop:  # a DPO/KTO stage's reference pass: its cap, or SIGTERM
        print(f"lmpo: {stop}; {_pipeline_resume_hint(Path(cfg.out))}", file=sys.stderr)
        return stop.code
    except KeyboardInterrupt as stop:
        if not launched_rank():
            print(f"lmpo: {_pipeline_resume_hint(Path(cfg.out))}", file=sys.stderr)
        if isinstance(stop, Terminated):
            return 143
        raise

    if launched_rank():  # under torchrun the table and the report are rank 0's
        return 0
    _print_stage_table(results, Path(cfg.out))
    from lmpo.reports import write_report

    print(f"report: {write_report(cfg.out)}")
    return 0


def _pipeline_resume_hint(out: Path) -> str:
    """What an interrupted pipeline leaves: the stage it was in, and how to go on from there."""
    from lmpo.cli.train import launcher
    from lmpo.trainers.run_dir import complete_checkpoints

    stages = [p for p in sorted(out.glob("*/run.json"), key=lambda p: p.stat().st_mtime)
              if not (p.parent / "result.json").is_file()]
    again = (f"continue it with `{launcher()}lmpo pipeline --resume {out}` (its finished stages are kept); "
             f"`{launcher()}lmpo pipeline --out {out} --overwrite true` starts every stage afresh")
    if not stages:
        return f"pipeline interrupted; {again}"
    stage = stages[-1].parent
    newest = complete_checkpoints(stage)
    where = f"its newest complete checkpoint is {newest[-1].name}" if newest else "it has no complete checkpoint yet"
    return f"pipeline interrupted in its {stage.name} stage ({where}); {again}"


def pipeline_options(yaml_file: str | None, flags: dict) -> tuple:
    """(PipelineConfig from defaults, YAML and flags; the dotted options the user set). The
    preset and task settings are applied under them by `run_pipeline`, as for the Python API."""
    from lmpo.cli.config import _flatten_dict, _flatten_fields, read_yaml
    from lmpo.trainers.pipeline import PipelineConfig

    _reject_stage_owned(flags, yaml_file)
    cfg = build(PipelineConfig, yaml_file=yaml_file, flags=flags)
    leaves = _flatten_fields(PipelineConfig)
    explicit = set(flags) | (set(_flatten_dict(read_yaml(yaml_file)[0], leaves)) if yaml_file else set())
    if cfg.resume and not yaml_file:  # `--resume DIR` alone: the interrupted pipeline's own options, as resolved
        from lmpo.trainers.run_dir import saved_config

        saved = {k: v for k, v in _flatten_dict(saved_config(cfg.resume), leaves).items() if k in leaves}
        saved.pop("resume", None)
        saved.pop("overwrite", None)  # how that pipeline started, not how it continues
        cfg = build(PipelineConfig, preset=saved, flags=flags)
        explicit = set(leaves) - ({"out"} - set(flags))  # nothing more is resolved: each option is the run's
    from lmpo.trainers.pipeline import sections_run

    ran = sections_run(cfg.rl)
    # a flag for a stage that does not run would be taken in silence (a YAML file may configure
    # several methods' stages, chosen among by --rl)
    idle = sorted(k for k in flags if "." in k and k.partition(".")[0] not in ran)
    if idle:
        raise ConfigError(f"{', '.join(idle)}: no {' or '.join(sorted({k.partition('.')[0] for k in idle}))} stage "
                          f"runs with --rl {cfg.rl} (its stages' options: {', '.join(f'--{s}.*' for s in ran)})")
    return cfg, explicit


def _print_findings(result) -> None:
    """The doctor's reading of a stage that just ended (nothing when it finds nothing)."""
    from lmpo.reports.doctor import format_findings
    from lmpo.reports.doctor_runs import diagnose_run
    from lmpo.trainers.pipeline import as_pipeline_flags

    try:
        findings = diagnose_run(result.run_dir)
    except (OSError, ValueError) as err:  # a report never stops a pipeline
        print(f"[doctor] {result.name}: could not read the metrics: {err}")
        return
    text = format_findings(findings, "[doctor] ")
    if text:
        print(as_pipeline_flags(text, result.name))


def in_pipeline_flags(findings: dict, path: Path) -> dict:
    """A pipeline stage's findings name the pipeline's flags (`--rl_stage.group_size`), as its own
    [doctor] lines do: `lmpo pipeline` refuses the stage's (`--group_size`)."""
    from dataclasses import replace

    from lmpo.reports.doctor_runs import labelled_runs
    from lmpo.reports.run_records import trainer_of

    runs = labelled_runs(path.parent if path.is_file() else path)
    stages = {label: run.name for label, run in runs.items() if trainer_of(run.parent) == "pipeline"}
    if not stages:
        return findings
    from lmpo.trainers.pipeline_config import as_pipeline_flags

    return {label: [replace(f, message=as_pipeline_flags(f.message, stages[label]),
                            remedy=as_pipeline_flags(f.remedy, stages[label])) for f in items]
            if label in stages else items for label, items in findings.items()}


PIPELINE_OWNED = ("model", "out", "task", "seed", "threads", "resume", "overwrite", "device", "precision")


def _reject_stage_owned(flags: dict, yaml_file: str | None) -> None:
    """Inside `lmpo pipeline`, each stage's model/out/task/seed/threads come from the pipeline."""
    where = {key: f"--{key}" for key in flags}  # each key as the user gave it: a flag, or a file's line
    if yaml_file:
        from lmpo.cli.config import _flatten_dict, _flatten_fields, read_yaml
        from lmpo.trainers.pipeline import PipelineConfig

        data, lines = read_yaml(yaml_file)
        for key in _flatten_dict(data, _flatten_fields(PipelineConfig)):
            where.setdefault(key, f"{yaml_file}: line {lines.get(key, '?')}: {key}")
    for key, said in where.items():
        section, dot, leaf = key.partition(".")
        if dot and leaf in ("resume", "overwrite"):
            raise ConfigError(f"{said}: the pipeline resumes or starts its stages itself; `lmpo pipeline --resume "
                              f"DIR` continues an interrupted pipeline (its finished stages kept, the interrupted "
                              f"one from its newest checkpoint)")
        if dot and leaf in PIPELINE_OWNED:
            raise ConfigError(f"{said}: the pipeline sets each stage's {leaf}; use the top-level --{leaf} "
                              f"(or set it in the stage's own `lmpo train` command)")


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _print_stage_table(results, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    from lmpo.trainers.pipeline import REWARD_MODEL_STAGE

    table = Table(title=f"lmpo pipeline — run files in {out}")
    for column in ("stage", "held-out accuracy", "format accuracy", "time (s)"):
        table.add_column(column, justify="right" if column != "stage" else "left")
    for r in results:
        if r.name == REWARD_MODEL_STAGE:  # its accuracy: the chosen reply scored above the rejected one
            table.add_row(f"{r.name} (reward model)", f"{_pct(r.accuracy)} pairwise", "n/a", f"{r.seconds:.1f}")
        else:
            table.add_row(r.name, _pct(r.accuracy), _pct(r.format_accuracy), f"{r.seconds:.1f}")
    Console().print(table)
    print(f"summary: {out / 'summary.json'}")
