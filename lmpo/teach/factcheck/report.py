"""The factcheck's outputs: a terminal table, factcheck.json and a self-contained factcheck.html."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmpo.reports.page import cell, esc, table
from lmpo.teach.factcheck.core import DEPENDS, ERROR, FAILS, HOLDS, Outcome, fill
from lmpo.teach.factcheck.texts import claim_texts, ui, verdict_word

COLOURS = {HOLDS: "#1a7f37", FAILS: "#c0392b", DEPENDS: "#b7791f", ERROR: "#666666"}
RICH_STYLES = {HOLDS: "bold green", FAILS: "bold red", DEPENDS: "bold yellow", ERROR: "bold magenta"}
ARXIV = re.compile(r"arXiv:(\d{4}\.\d{4,5})")


@dataclass
class Report:
    outcomes: list[Outcome]
    seconds: float
    """Wall time of all claims (the SFT start included when it had to be trained)."""
    start_seconds: float
    """Wall time spent obtaining the SFT start (about 0 when it was cached)."""
    lang: str
    threads: int
    fast_only: bool


def number(value: Any) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def claim_record(outcome: Outcome, index: int, lang: str) -> dict[str, Any]:
    texts = claim_texts(outcome.claim, lang)
    note = fill(texts["notes"][outcome.note], outcome.values) if outcome.note else ""
    return {"number": index, "name": outcome.claim.name, "fast": outcome.claim.fast,
            "claim": texts["text"], "papers": list(outcome.claim.papers),
            "criterion": fill(texts["criterion"], outcome.claim.limits),
            "verdict": outcome.verdict, "verdict_text": verdict_word(outcome.verdict, lang),
            "note": note, "summary": fill(texts["summary"], outcome.values) if outcome.values else "",
            "evidence": outcome.values, "seconds": round(outcome.seconds, 2), "error": outcome.error,
            "plot": f"plots/{outcome.claim.name}.png" if outcome.plot else None}


def write_outputs(report: Report, out: Path) -> tuple[Path, Path]:
    """DIR/factcheck.json, DIR/factcheck.html and DIR/plots/NAME.png."""
    out.mkdir(parents=True, exist_ok=True)
    records = [claim_record(o, i, report.lang) for i, o in enumerate(report.outcomes, 1)]
    plots = out / "plots"
    for outcome in report.outcomes:
        if outcome.plot:
            plots.mkdir(exist_ok=True)
            (plots / f"{outcome.claim.name}.png").write_bytes(outcome.plot)
    summary = {"lang": report.lang, "threads": report.threads, "fast_only": report.fast_only,
               "total_seconds": round(report.seconds, 2), "start_seconds": round(report.start_seconds, 2),
               "counts": {v: sum(r["verdict"] == v for r in records) for v in (HOLDS, FAILS, DEPENDS, ERROR)},
               "claims": records}
    json_path = out / "factcheck.json"
    json_path.write_text(json.dumps(summary, indent=2, ensure_ascii=False, default=str))
    html_path = out / "factcheck.html"
    html_path.write_text(render_html(report, records))
    return json_path, html_path


def claims(words: dict[str, str], n: int) -> str:
    """`1 claim`, `16 claims`, in the report's language."""
    return words["claims_one"] if n == 1 else words["claims_many"].format(n=n)


def render_html(report: Report, records: list[dict]) -> str:
    words = ui(report.lang)
    plots = {o.claim.name: o.plot for o in report.outcomes if o.plot}
    rows = [[cell(r["number"], numeric=True), cell(f'<a href="#{esc(r["name"])}">{esc(r["claim"])}</a>', raw_html=True),
             cell(_badge(r["verdict"], r["verdict_text"]), raw_html=True), cell(f'{r["seconds"]:.1f}', numeric=True)]
            for r in records]
    body = [f"<p>{esc(fill(words['intro'], {'claims': claims(words, len(records)), 'seconds': report.seconds, 'threads': report.threads}))}</p>",
            table(["#", words["claim"], words["verdict"], words["seconds"]], rows)]
    body += [_section(r, plots.get(r["name"]), words) for r in records]
    return (f'<!DOCTYPE html>\n<html lang="{esc(report.lang)}">\n<head>\n<meta charset="utf-8">\n'
            f"<title>{esc(words['title'])}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
            f"<h1>{esc(words['title'])}</h1>\n" + "\n".join(body) + "\n</body>\n</html>\n")


def _section(r: dict, plot: bytes | None, words: dict) -> str:
    papers = "; ".join(ARXIV.sub(lambda m: f'<a href="https://arxiv.org/abs/{m.group(1)}">arXiv:{m.group(1)}</a>',
                                 esc(p)) for p in r["papers"])
    parts = [f'<section id="{esc(r["name"])}">',
             f'<h2>{r["number"]}. {esc(r["claim"])}</h2>',
             f'<p>{_badge(r["verdict"], r["verdict_text"])} {esc(r["note"] or r["error"])}</p>',
             f'<p><b>{esc(words["criterion"])}</b> {esc(r["criterion"])}</p>',
             f'<p><b>{esc(words["source"])}</b> {papers}</p>']
    if r["summary"]:
        parts.append(f'<p><b>{esc(words["key_numbers_label"])}</b> {esc(r["summary"])}</p>')
    if r["evidence"]:
        parts.append("<details><summary>" + esc(words["evidence"]) + "</summary>" +
                     table([words["measure"], words["value"]],
                           [[cell(k), cell(number(v), numeric=True)] for k, v in r["evidence"].items()]) + "</details>")
    if plot:
        encoded = base64.b64encode(plot).decode()
        parts.append(f'<figure><img src="data:image/png;base64,{encoded}" alt="{esc(r["name"])}"></figure>')
    parts.append(f'<p class="meta">{esc(r["name"])} · {esc(words["fast"] if r["fast"] else words["slow"])} · '
                 f'{r["seconds"]:.1f} s</p></section>')
    return "\n".join(parts)


def _badge(verdict: str, text: str) -> str:
    return f'<span class="verdict" style="background:{COLOURS[verdict]}">{esc(text)}</span>'


STYLE = """
body { font-family: system-ui, "Noto Sans CJK SC", "PingFang SC", sans-serif; margin: 2em auto; max-width: 1000px;
       color: #222; padding: 0 1em; line-height: 1.45; }
h2 { margin-top: 1.8em; border-bottom: 1px solid #ddd; font-size: 1.2em; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.7em; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f3f3f3; }
.verdict { color: white; padding: 0.1em 0.6em; border-radius: 0.3em; font-weight: bold; white-space: nowrap; }
img { max-width: 100%; border: 1px solid #eee; }
.meta { color: #777; font-size: 0.85em; }
"""


def print_table(report: Report) -> None:
    from rich.console import Console
    from rich.table import Table

    words = ui(report.lang)
    title = fill(words["table_title"], {"claims": claims(words, len(report.outcomes)), "seconds": report.seconds,
                                        "threads": report.threads})
    grid = Table(title=title, show_lines=True)
    grid.add_column("#", justify="right")
    grid.add_column(words["claim"], overflow="fold", max_width=26)
    grid.add_column(words["verdict"])
    grid.add_column(words["key_numbers"], overflow="fold")
    grid.add_column(words["seconds"], justify="right")
    for i, outcome in enumerate(report.outcomes, 1):
        r = claim_record(outcome, i, report.lang)
        grid.add_row(str(i), r["name"], f'[{RICH_STYLES[r["verdict"]]}]{esc_rich(r["verdict_text"])}[/]',
                     esc_rich(r["summary"] or r["error"]), f"{outcome.seconds:.1f}")
    Console().print(grid)


def esc_rich(text: str) -> str:
    from rich.markup import escape

    return escape(text)
