"""``write_report``: a run directory -> ``report/*.png`` + ``report/report.html``."""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmpo.trainers.run_dir import complete_checkpoints, saved_config

from . import page
from .metrics import Row, Series, all_series, as_float, kept_rows, nonfinite_points, read_metrics, refuse_non_file
from .panels import MAIN_KEYS, REWARD_MODEL_KEYS, REWARD_MODEL_TRAINER, Panel, panels_for
from .plots import render_panel
from .rollbacks import read_rollbacks, rollback_section, without_rollbacks
from .run_records import trainer_of, unfinished_pipeline_stages
from .stages import Stage, fmt_pct, fmt_seconds, read_summary, render_stages
from .trajectories import TRAJECTORIES_FILE, html_section

METRICS_FILE = "metrics.jsonl"
ROUND_TRAINERS = {"online_dpo": "round", "rft": "round"}
"""Trainers whose `step` counts rounds (sample, then train), as their x axes say."""
SUMMARY_FILE = "summary.json"
REPORT_DIR = "report"
HTML_FILE = "report.html"


@dataclass
class Report:
    html: Path
    images: list[Path] = field(default_factory=list)


def write_report(run_dir: str | Path) -> Path:
    """Write plots and ``report.html`` into ``run_dir/report/``; return the HTML path.

    ``run_dir`` may be a training run (``metrics.jsonl``), a pipeline
    (``summary.json`` with per-stage ``run_dir``\\ s, whose own reports are
    written too), or both.
    """
    return _write(Path(run_dir), seen=frozenset()).html


def _write(run_dir: Path, seen: frozenset[Path]) -> Report:
    metrics, summary = run_dir / METRICS_FILE, run_dir / SUMMARY_FILE
    if run_dir.exists() and not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is a file, not a run directory (the directory holding it is "
                                f"{run_dir.parent})")
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory does not exist: {run_dir}")
    if not metrics.is_file() and not summary.is_file():
        refuse_non_file(metrics)
        refuse_non_file(summary)
        stages = [stage.name for stage in unfinished_pipeline_stages(run_dir) if (stage / METRICS_FILE).is_file()]
        if stages:
            raise FileNotFoundError(f"{run_dir} is a pipeline that has not finished (no {SUMMARY_FILE}); report "
                                    f"its stages: {', '.join(f'lmpo report {run_dir / s}' for s in stages)}; if "
                                    f"it was interrupted, `lmpo pipeline --resume {run_dir}` continues it")
        if (run_dir / "compare.html").is_file():  # `lmpo compare` writes its own page
            runs = sorted(str(m.parent) for m in run_dir.rglob(METRICS_FILE))[:2]
            raise FileNotFoundError(f"{run_dir} is a comparison (lmpo compare): its page is {run_dir / 'compare.html'}"
                                    + (f"; report one of its runs: {', '.join(f'lmpo report {r}' for r in runs)}"
                                       if runs else ""))
        raise FileNotFoundError(
            f"{run_dir} has neither {METRICS_FILE} nor {SUMMARY_FILE}; nothing to report"
        )
    out = run_dir / REPORT_DIR
    out.mkdir(exist_ok=True)
    report = Report(html=out / HTML_FILE)
    body: list[str] = []
    if summary.is_file():
        body += _pipeline_section(run_dir, summary, report, seen | {run_dir.resolve()})
    if metrics.is_file():
        body += _metrics_section(metrics, report)
    if (run_dir / TRAJECTORIES_FILE).is_file():
        body += html_section(run_dir)
    title = f"Report: {run_dir.resolve().name}"
    report.html.write_text(page.document(title, body), encoding="utf-8")
    return report


# --------------------------------------------------------------- single run


def _metrics_section(metrics: Path, report: Report) -> list[str]:
    with warnings.catch_warnings(record=True) as skipped:  # said on the page too, not on stderr alone
        warnings.simplefilter("always")
        rows = read_metrics(metrics)
    for said in skipped:
        warnings.warn(said.message, said.category, stacklevel=2)
    rollbacks = read_rollbacks(rows)
    kept = without_rollbacks(kept_rows(rows))
    data = all_series(kept)
    nonfinite = nonfinite_points(kept, data)
    body = [page.heading("Training metrics"), _run_overview(metrics, rows),
            *(page.paragraph(str(said.message), "note") for said in skipped), *_unfinished(metrics.parent),
            *rollback_section(rollbacks), *_nonfinite_note(metrics, nonfinite)]
    if not data and not nonfinite:
        finished = (metrics.parent / "result.json").is_file()
        return body + [page.paragraph("No numeric metrics were logged: the run finished without a row."
                                      if finished else "No numeric metrics logged yet.", "note")]
    trainer = trainer_of(metrics.parent)
    body.append(_final_values_table(data, REWARD_MODEL_KEYS if trainer == REWARD_MODEL_TRAINER else {}, nonfinite))
    estimator = saved_config(metrics.parent).get("kl_estimator")
    for panel in _panel_order(data, trainer, estimator if isinstance(estimator, str) else None):
        png = render_panel(panel, data, report.html.parent, rollbacks, nonfinite, ROUND_TRAINERS.get(trainer, "step"))
        if png is not None:
            report.images.append(png)
            body.append(page.image(png.name, panel.title))
    return body


def _panel_order(data: dict[str, Series], trainer: str | None = None,
                 kl_estimator: str | None = None) -> list[Panel]:
    """Panels in display order; in an RL run the policy loss is a side show."""
    panels = panels_for(data, trainer, kl_estimator)
    if "reward_mean" not in data:
        return panels
    return [p for p in panels if p.name != "loss"] + [p for p in panels if p.name == "loss"]


NonFinite = dict[str, list[tuple[float, float]]]


def _nonfinite_text(points: list[tuple[float, float]], shown: int = 5) -> str:
    """`nan at step 3, inf at step 5` (the first few, then how many more)."""
    text = ", ".join(f"{v} at step {_fmt_step(s)}" for s, v in points[:shown])
    return text + (f" and {len(points) - shown} more" if len(points) > shown else "")


def _nonfinite_note(metrics: Path, nonfinite: NonFinite) -> list[str]:
    """Said on stderr and on the page: the curves and the table's figures leave these values out."""
    if not nonfinite:
        return []
    said = "; ".join(f"{key}: {_nonfinite_text(points)}" for key, points in nonfinite.items())
    warnings.warn(f"{metrics}: non-finite values, left out of the curves (marked where they are) and of the "
                  f"table's figures: {said}", RuntimeWarning, stacklevel=3)
    return [page.paragraph(f"Non-finite values (NaN or ±inf), left out of the curves and of the table's last, "
                           f"min and max; dotted lines mark their steps: {said}", "note")]


def _run_overview(metrics: Path, rows: list[Row]) -> str:
    return page.paragraph(f"{len(rows)} rows logged in {metrics.name}.")


def unfinished_note(run_dir: Path) -> str | None:
    """What to say of a training run that has not finished (no result.json): interrupted, or
    still running; None for a finished run or a directory no trainer made (no run.json)."""
    started = trainer_of(run_dir, command=True)
    if started in (None, "pipeline") or (run_dir / "result.json").is_file():  # a pipeline ends in summary.json
        return None
    command = None if started == "?" else started
    done = complete_checkpoints(run_dir)
    if not done:
        return ("This run has not finished (no result.json): it is still running, or it stopped before "
                "its first checkpoint. Its curves end where it is, or where it stopped.")
    if trainer_of(run_dir.parent) == "pipeline":  # a stage: resuming it alone would not run the stages after it
        resume = f"`lmpo pipeline --resume {run_dir.parent}`"
    elif command:
        resume = f"`lmpo train {command} --resume {run_dir}`"
    else:
        resume = f"its command with --resume {run_dir}"
    return (f"This run has not finished (no result.json): it is still running, or it was interrupted. Its "
            f"newest complete checkpoint is {done[-1].name}; {resume} continues an interrupted run from it.")


def _unfinished(run_dir: Path) -> list[str]:
    note = unfinished_note(run_dir)
    return [page.paragraph(note, "note")] if note else []


def _ordered_keys(data: dict[str, Series]) -> list[str]:
    main = [k for k in MAIN_KEYS if k in data]
    return main + sorted(k for k in data if k not in MAIN_KEYS)


def fmt_value(x: float) -> str:
    if x == 0 or (1e-3 <= abs(x) < 1e5):
        return f"{x:.4g}"
    return f"{x:.3e}"


def _fmt_step(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _final_values_table(data: dict[str, Series], names: dict[str, str] | None = None,
                        nonfinite: NonFinite | None = None) -> str:
    """Last, min, max and count of each metric's finite points; a column of the non-finite ones
    when there are any (a metric with no finite point still gets its row)."""
    nonfinite = nonfinite or {}
    rows = []
    for key in _ordered_keys({**dict.fromkeys(nonfinite, ((), ())), **data}):
        xs, ys = data.get(key, ([], []))
        figures = [fmt_value(ys[-1]), _fmt_step(xs[-1]), fmt_value(min(ys)), fmt_value(max(ys))] if ys else ["n/a"] * 4
        rows.append([page.cell((names or {}).get(key, key)), *(page.cell(f, numeric=True) for f in figures),
                     page.cell(len(ys), numeric=True)])
        if nonfinite:
            rows[-1].append(page.cell(_nonfinite_text(nonfinite[key]) if key in nonfinite else ""))
    headers = ["metric", "last", "at step", "min", "max", "points"] + ["non-finite"] * bool(nonfinite)
    return page.table(headers, rows)


# ---------------------------------------------------------------- pipeline


def _pipeline_section(
    run_dir: Path, summary: Path, report: Report, seen: frozenset[Path]
) -> list[str]:
    stages, extras = read_summary(summary)
    body = [page.heading("Pipeline stages")]
    if not stages:
        body.append(page.paragraph("summary.json lists no stages.", "note"))
    sub_reports = {i: _stage_report(run_dir, s, seen) for i, s in enumerate(stages)}
    agent = _stage_agent_fields(summary, len(stages))
    body.append(_stage_table(stages, sub_reports, report.html.parent, agent))
    body += _breakdown_tables(summary, stages)
    png = render_stages(stages, report.html.parent)
    if png is not None:
        report.images.append(png)
        body.append(page.image(png.name, "Accuracy and time per stage"))
    if extras:
        body += [page.heading("Other summary values", 3), _extras_table(extras)]
    for i, stage in enumerate(stages):
        body += _stage_plots(stage, sub_reports[i], report.html.parent)
    return body


def _stage_dir(run_dir: Path, stage: Stage) -> Path | None:
    if not stage.run_dir:
        return None
    path = Path(stage.run_dir)
    return path if path.is_absolute() else run_dir / path


def _stage_report(
    run_dir: Path, stage: Stage, seen: frozenset[Path]
) -> Report | str | None:
    """The stage's own report, an error message, or None if it has no metrics."""
    stage_dir = _stage_dir(run_dir, stage)
    if stage_dir is None:
        return None
    if not (stage_dir / METRICS_FILE).is_file():
        try:
            refuse_non_file(stage_dir / METRICS_FILE)
        except ValueError as exc:  # said, as a stage whose report fails is, not skipped without a word
            warnings.warn(f"stage {stage.name!r}: {exc}", RuntimeWarning, stacklevel=2)
            return f"stage {stage.name!r}: {exc}"
        return None
    if stage_dir.resolve() in seen:
        return None  # a stage pointing back at the pipeline dir: no recursion
    try:
        return _write(stage_dir, seen)
    except (OSError, ValueError) as exc:
        msg = f"could not write report for stage {stage.name!r}: {exc}"
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
        return msg


def _rel(target: Path, start: Path) -> str:
    return Path(os.path.relpath(target, start)).as_posix()


# (tool-call rate, {termination reason: fraction}) of one stage
AgentFields = tuple[float | None, dict[str, float]]
MAIN_TERMINATIONS = 3  # reasons shown per stage in the table


def _stage_agent_fields(summary: Path, n: int) -> list[AgentFields]:
    """Per stage: its ``tool_call_rate`` and ``terminations``, where present.

    ``read_summary`` has already checked that ``stages`` is a list of objects.
    """
    raw = json.loads(summary.read_text(encoding="utf-8")).get("stages", [])
    out: list[AgentFields] = []
    for stage in raw[:n]:
        rate = as_float(stage.get("tool_call_rate"))
        ends = stage.get("terminations")
        ends = ends if isinstance(ends, dict) else {}
        fracs = {str(k): float(v) for k, v in ends.items()
                 if as_float(v) is not None and math.isfinite(float(v))}
        out.append((rate if rate is not None and math.isfinite(rate) else None, fracs))
    return out + [(None, {})] * (n - len(out))


def _fmt_terminations(fracs: dict[str, float]) -> str:
    main = sorted(((v, k) for k, v in fracs.items() if v > 0), key=lambda p: -p[0])
    return ", ".join(f"{k} {fmt_pct(v)}" for v, k in main[:MAIN_TERMINATIONS]) or "n/a"


def _stage_table(
    stages: list[Stage],
    subs: dict[int, Report | str | None],
    out_dir: Path,
    agent: list[AgentFields] | None = None,
) -> str:
    agent = agent or [(None, {})] * len(stages)
    has_rate = any(agent_rate for agent_rate, _ in agent)  # 0 everywhere (a task without tools): as the console, none
    has_ends = any(ends for _, ends in agent)
    rows = []
    for i, s in enumerate(stages):
        sub = subs[i]
        if isinstance(sub, Report):
            run = page.link(_rel(sub.html, out_dir), s.run_dir or "report")
        else:
            run = page.esc(s.run_dir or "")
        pairwise = s.kind == "reward_model"  # its accuracy: the chosen reply scored above the rejected one
        rows.append([
            page.cell(s.label),
            page.cell(f"{fmt_pct(s.pairwise_accuracy)} pairwise" if pairwise else fmt_pct(s.accuracy), numeric=True),
            page.cell(fmt_pct(s.format_accuracy), numeric=True),
            page.cell(fmt_seconds(s.seconds), numeric=True),
        ])
        if has_rate:
            rows[-1].append(page.cell(fmt_pct(agent[i][0]), numeric=True))
        if has_ends:
            rows[-1].append(page.cell(_fmt_terminations(agent[i][1])))
        rows[-1].append(page.cell(run, raw_html=True))
    headers = ["stage", "accuracy", "format accuracy", "time"]
    headers += ["tool-call rate"] * has_rate + ["episode endings"] * has_ends
    return page.table(headers + ["run"], rows)


def _breakdown_tables(summary: Path, stages: list[Stage]) -> list[str]:
    """Hand-offs and environment tallies per stage, then success per problem kind and stage
    (tasks whose evaluation reports a ``breakdown``, e.g. aftersales)."""
    raw = json.loads(summary.read_text(encoding="utf-8")).get("stages", [])[:len(stages)]
    found = [s.get("breakdown") if isinstance(s.get("breakdown"), dict) else {} for s in raw]
    if not any(found):
        return []
    names = [s.name for s in stages]
    tallies = sorted({k for b in found for k in b if k.endswith("_mean")})
    rows = []
    for i, b in enumerate(found):
        cells = [page.cell(names[i])]
        for key in ("handoff_rate", "handoff_correct", "handoff_unnecessary"):
            cells.append(page.cell(fmt_pct(as_float(b.get(key))), numeric=True))
        cells += [page.cell(fmt_value(b[k]) if k in b else "n/a", numeric=True) for k in tallies]
        rows.append(cells)
    out = [page.heading("Hand-offs and environment tallies (held-out)", 3),
           page.table(["stage", "hand-offs", "correct hand-offs", "unnecessary hand-offs",
                       *[k[:-5].replace("_", " ") + " / episode" for k in tallies]], rows)]
    kinds = sorted({k for b in found for k in (b.get("by_kind") or {})})
    if kinds:
        rows = []
        for kind in kinds:
            cells = [page.cell(kind)]
            for b in found:
                f = (b.get("by_kind") or {}).get(kind)
                if not isinstance(f, dict):
                    cells.append(page.cell("n/a"))
                    continue
                extra = "".join(f", {k[:-5].replace('_', ' ')} {fmt_value(v)}/ep" for k, v in f.items()
                                if k.endswith("_mean"))
                ends = _fmt_terminations(f.get("terminations") or {})
                cells.append(page.cell(f"{fmt_pct(as_float(f.get('accuracy')))} (hand-offs "
                                       f"{fmt_pct(as_float(f.get('handoff_rate')))}{extra}; {ends})"))
            rows.append(cells)
        out += [page.heading("Held-out success per problem kind", 3), page.table(["kind", *names], rows)]
    return out


def _extras_table(extras: dict[str, Any]) -> str:
    rows = [[page.cell(k), page.cell(_fmt_extra(v))] for k, v in extras.items()]
    return page.table(["key", "value"], rows)


def _fmt_extra(value: Any) -> str:
    if isinstance(value, float) and math.isfinite(value):
        return fmt_value(value)
    text = str(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _stage_plots(stage: Stage, sub: Report | str | None, out_dir: Path) -> list[str]:
    if sub is None:
        return []
    body = [page.heading(f"Stage: {stage.name}")]
    if isinstance(sub, str):
        return body + [page.paragraph(sub, "note")]
    body.append(f"<p>{page.link(_rel(sub.html, out_dir), 'full stage report')}</p>")
    for png in sub.images:
        body.append(page.image(_rel(png, out_dir), f"{stage.name}: {png.stem}"))
    return body
