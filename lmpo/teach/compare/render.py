"""The comparison written out: compare.json (everything), compare.md (the table and the
recommendation), a rich table for the terminal, two PNG plots (held-out accuracy against
samples and against wall time) and compare.html with all of them."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from matplotlib import rcParams
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from lmpo.reports import page
from lmpo.teach.compare.records import RunRecord
from lmpo.teach.compare.summary import MethodSummary, Recommendation, Spread, pct
from lmpo.teach.compare.texts import joined, tx

COLUMNS = ("method", "held-out accuracy", "wall time (s)", "peak memory (MB)", "models held", "reference",
           "samples", "completion tokens", "budget")
PLOTS = {"samples": ("accuracy_vs_samples.png", "samples used"),
         "seconds": ("accuracy_vs_time.png", "wall time (s)")}


@dataclass
class Comparison:
    command: str
    task: str
    budget: dict
    seeds: list[int]
    start: Spread
    methods: list[MethodSummary]
    recommendation: Recommendation
    runs: list[RunRecord]
    start_label: str = "SFT start"
    """The table's first row: the task's SFT start, or the model --start named."""
    lang: str = "en"
    """The language of its words (--lang): the table, the recommendation, compare.md and compare.html."""


def columns(lang: str = "en") -> tuple[str, ...]:
    """The table's headers in `lang` (COLUMNS in English)."""
    return tuple(tx("columns", lang).split("|"))


def _num(spread: Spread, digits: int = 0) -> str:
    if spread.mean is None:
        return "n/a"
    text = f"{spread.mean:,.{digits}f}"
    return text if spread.std is None else f"{text} ± {spread.std:,.{digits}f}"


def table_rows(c: Comparison) -> list[list[str]]:
    rows = [[c.start_label, pct(c.start), "", "", "", "", "", "", ""]]
    for m in c.methods:
        rows.append([m.method, pct(m.accuracy) + _no_steps_mark(m, c.lang), _seconds(m, c.lang), _num(m.peak_rss_mb),
                     joined(m.models_held, c.lang), m.reference, _num(m.samples), _num(m.completion_tokens),
                     m.budget_unit])
    return rows


def _seconds(m: MethodSummary, lang: str = "en") -> str:
    """A method that trained 0 steps spent its seconds loading and in its reference pass: said,
    to a tenth (a whole second of it reads "0")."""
    if m.trained_none and m.seconds.mean is not None:
        return tx("reference_pass_only", lang, seconds=_num(m.seconds, 1))
    return _num(m.seconds)


def _no_steps_mark(m: MethodSummary, lang: str = "en") -> str:
    if m.trained_none:
        return tx("mark.none", lang)
    if m.no_steps_seeds:
        return tx("mark.some", lang, n=len(m.no_steps_seeds), of=len(m.seeds))
    return ""


def write_json(c: Comparison, out: Path) -> Path:
    path = out / "compare.json"
    data = asdict(c)
    if c.lang == "en":  # as before --lang: an English comparison's file is unchanged
        del data["lang"]
    data["plots"] = {key: name for key, (name, _) in PLOTS.items()}
    path.write_text(json.dumps(data, indent=2))
    return path


def markdown(c: Comparison) -> str:
    names = columns(c.lang)
    head = "| " + " | ".join(names) + " |\n|" + "|".join("---" for _ in names) + "|\n"
    body = "".join("| " + " | ".join(row) + " |\n" for row in table_rows(c))
    budget = ", ".join(f"{k}={v}" for k, v in c.budget.items())
    return (tx("md_head", c.lang, command=c.command, task=c.task, budget=budget, seeds=", ".join(map(str, c.seeds)))
            + f"{head}{body}\n" + "\n".join(f"- {line}" for line in c.recommendation.lines) + "\n")


def print_table(c: Comparison, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=tx("title", c.lang, task=c.task, out=out))
    for i, column in enumerate(columns(c.lang)):
        table.add_column(column, justify="left" if COLUMNS[i] in ("method", "models held", "reference", "budget")
                         else "right")
    for row in table_rows(c):
        table.add_row(*row)
    console = Console()
    if not console.is_terminal:  # a log file or a pipe: no terminal width to fold the table into
        console = Console(width=180)
    console.print(table)
    for line in c.recommendation.lines:
        console.print(line, highlight=False, markup=False)


def plot(c: Comparison, out: Path, x_key: str) -> Path:
    """Held-out accuracy at each evaluation against samples or seconds: each seed thin, the mean
    over seeds (at the same evaluation index) thick."""
    name, label = PLOTS[x_key]
    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    colors = rcParams["axes.prop_cycle"].by_key()["color"]
    for i, m in enumerate(c.methods):
        color = colors[i % len(colors)]
        curves = [_points(r, x_key) for r in c.runs if r.method == m.method]
        curves = [cv for cv in curves if cv]
        for xs, ys in curves:
            ax.plot(xs, ys, color=color, alpha=0.3, linewidth=1)
        if curves:
            n = min(len(xs) for xs, _ in curves)
            mean_x = [statistics.fmean(xs[i] for xs, _ in curves) for i in range(n)]
            mean_y = [statistics.fmean(ys[i] for _, ys in curves) for i in range(n)]
            ax.plot(mean_x, mean_y, color=color, linewidth=2.2, marker="o", markersize=3, label=m.method)
    if c.start.mean is not None:
        ax.axhline(c.start.mean, color="grey", linestyle="--", linewidth=1, label=_plot_label(c))
    ax.set_xlabel(label)
    ax.set_ylabel("held-out accuracy")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{c.task}: held-out accuracy against {label} (thin: one seed, thick: mean)", fontsize=10)
    path = out / name
    fig.savefig(path, dpi=100)
    return path


def _plot_label(c: Comparison) -> str:
    """The start's label in the plots, which stay in English under any --lang: matplotlib's default
    fonts have no Chinese characters (they would be drawn as empty boxes)."""
    english = {tx(key, c.lang): tx(key) for key in ("label.sft", "label.start")}
    return english.get(c.start_label, c.start_label)


def _points(record: RunRecord, x_key: str) -> tuple[list[float], list[float]] | None:
    pts = [(p.samples if x_key == "samples" else p.seconds, p.accuracy) for p in record.curve]
    pts = [(x, y) for x, y in pts if x is not None]
    return ([x for x, _ in pts], [y for _, y in pts]) if pts else None


def write_html(c: Comparison, out: Path) -> Path:
    rows = [[page.cell(v, numeric=i not in (0, 4, 5, 8)) for i, v in enumerate(row)] for row in table_rows(c)]
    budget, lang = ", ".join(f"{k}={v}" for k, v in c.budget.items()), c.lang
    body = [page.paragraph(tx("html_command", lang, command=c.command)),
            page.paragraph(tx("html_setup", lang, task=c.task, budget=budget, seeds=", ".join(map(str, c.seeds)))),
            page.table(columns(lang), rows), page.heading(tx("html_recommendation", lang)),
            *[page.paragraph(line) for line in c.recommendation.lines], page.heading(tx("html_curves", lang)),
            *[page.image(name, tx("html_caption", lang, label=tx(f"plot.{key}", lang)))
              for key, (name, _) in PLOTS.items()],
            page.heading(tx("html_sample", lang)),
            *[page.paragraph(tx("html_what", lang, method=m.method, what=m.what_counts)) for m in c.methods]]
    path = out / "compare.html"
    path.write_text(page.document("lmpo compare", body, lang=lang), encoding="utf-8")
    return path


def write_all(c: Comparison, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    md = out / "compare.md"
    md.write_text(markdown(c))
    return {"json": write_json(c, out), "md": md, **{k: plot(c, out, k) for k in PLOTS}, "html": write_html(c, out)}
