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


def _num(spread: Spread, digits: int = 0) -> str:
    if spread.mean is None:
        return "n/a"
    text = f"{spread.mean:,.{digits}f}"
    return text if spread.std is None else f"{text} ± {spread.std:,.{digits}f}"


def table_rows(c: Comparison) -> list[list[str]]:
    rows = [[c.start_label, pct(c.start), "", "", "", "", "", "", ""]]
    for m in c.methods:
        rows.append([m.method, pct(m.accuracy) + _no_steps_mark(m), _seconds(m), _num(m.peak_rss_mb),
                     ", ".join(m.models_held), m.reference, _num(m.samples), _num(m.completion_tokens), m.budget_unit])
    return rows


def _seconds(m: MethodSummary) -> str:
    """A method that trained 0 steps spent its seconds loading and in its reference pass: said,
    to a tenth (a whole second of it reads "0")."""
    if m.trained_none and m.seconds.mean is not None:
        return f"{_num(m.seconds, 1)} (reference pass only)"
    return _num(m.seconds)


def _no_steps_mark(m: MethodSummary) -> str:
    if m.trained_none:
        return " (0 steps: the start model)"
    if m.no_steps_seeds:
        return f" ({len(m.no_steps_seeds)} of {len(m.seeds)} seeds: 0 steps)"
    return ""


def write_json(c: Comparison, out: Path) -> Path:
    path = out / "compare.json"
    data = asdict(c)
    data["plots"] = {key: name for key, (name, _) in PLOTS.items()}
    path.write_text(json.dumps(data, indent=2))
    return path


def markdown(c: Comparison) -> str:
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "|".join("---" for _ in COLUMNS) + "|\n"
    body = "".join("| " + " | ".join(row) + " |\n" for row in table_rows(c))
    budget = ", ".join(f"{k}={v}" for k, v in c.budget.items())
    return (f"Command: `{c.command}`\n\nTask {c.task}; budget {budget}; seeds {', '.join(map(str, c.seeds))}; "
            f"accuracy is mean ± std over seeds (points), other columns mean (± std) over seeds.\n\n"
            f"{head}{body}\n" + "\n".join(f"- {line}" for line in c.recommendation.lines) + "\n")


def print_table(c: Comparison, out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"lmpo compare — {c.task}, runs in {out}")
    for column in COLUMNS:
        table.add_column(column, justify="left" if column in ("method", "models held", "reference", "budget") else "right")
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
        ax.axhline(c.start.mean, color="grey", linestyle="--", linewidth=1, label=c.start_label)
    ax.set_xlabel(label)
    ax.set_ylabel("held-out accuracy")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{c.task}: held-out accuracy against {label} (thin: one seed, thick: mean)", fontsize=10)
    path = out / name
    fig.savefig(path, dpi=100)
    return path


def _points(record: RunRecord, x_key: str) -> tuple[list[float], list[float]] | None:
    pts = [(p.samples if x_key == "samples" else p.seconds, p.accuracy) for p in record.curve]
    pts = [(x, y) for x, y in pts if x is not None]
    return ([x for x, _ in pts], [y for _, y in pts]) if pts else None


def write_html(c: Comparison, out: Path) -> Path:
    rows = [[page.cell(v, numeric=i not in (0, 4, 5, 8)) for i, v in enumerate(row)] for row in table_rows(c)]
    budget = ", ".join(f"{k}={v}" for k, v in c.budget.items())
    body = [page.paragraph(f"Command: {c.command}"),
            page.paragraph(f"Task {c.task}; budget {budget}; seeds {', '.join(map(str, c.seeds))}. Accuracy: mean ± "
                           f"std over seeds (points); other columns: mean (± std) over seeds."),
            page.table(COLUMNS, rows), page.heading("Recommendation"),
            *[page.paragraph(line) for line in c.recommendation.lines], page.heading("Curves"),
            *[page.image(name, f"held-out accuracy against {label}") for name, label in PLOTS.values()],
            page.heading("What counts as a sample"),
            *[page.paragraph(f"{m.method}: {m.what_counts}.") for m in c.methods]]
    path = out / "compare.html"
    path.write_text(page.document("lmpo compare", body), encoding="utf-8")
    return path


def write_all(c: Comparison, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    md = out / "compare.md"
    md.write_text(markdown(c))
    return {"json": write_json(c, out), "md": md, **{k: plot(c, out, k) for k in PLOTS}, "html": write_html(c, out)}
