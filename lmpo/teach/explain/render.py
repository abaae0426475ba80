"""Three renderings of one `Explanation`: the terminal (rich), an HTML page and a markdown page.

All three print each value's cells with `fmt`, so the numbers read the same everywhere; the HTML
tables carry `data-name` and the markdown tables a `<!-- value: NAME -->` marker, which the tests
use to read the numbers back.
"""

from __future__ import annotations

import html
from pathlib import Path

from lmpo.teach.explain.model import Explanation, Value, fmt
from lmpo.teach.explain.page import Texts

IMAGE_DIR = "img"


def settings_text(settings: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items())


def value_rows(value: Value) -> list[tuple[str, list[str]]]:
    """(row label, formatted cells) of a value's table."""
    if value.row_labels:
        return [(label, [fmt(c) for c in row]) for label, row in zip(value.row_labels, value.rows)]
    return [(value.symbol, [fmt(c) for c in row]) for row in value.rows]


def provenance(value: Value, tx: Texts) -> str:
    """`(given)` or `(computed by FUNCTION)`, with the language's parentheses."""
    text = tx("heading.given") if value.given else tx("heading.computed", source=value.source)
    return tx("heading.provenance", text=text)


def legend(expl: Explanation, tx: Texts) -> str:
    """The notes on `·` and on push, each only where the page has such a cell or table."""
    values = expl.values()
    notes = [tx("heading.note_masked")] if any(c is None for v in values for row in v.rows for c in row) else []
    notes += [tx("heading.note_push")] if any(v.name == "push" for v in values) else []
    return " ".join(notes)


# ---------------------------------------------------------------- terminal
def render_terminal(expl: Explanation, console) -> None:
    """Print the explanation step by step (rich); every text is escaped, so `[1]` stays `[1]`.
    Chinese prose is broken into lines here (cjk_wrap), where rich would break it at a lone space."""
    from rich.markup import escape as x
    from rich.panel import Panel
    from rich.table import Table

    tx = Texts(expl.lang)
    fit = _line_breaker(expl.lang, console.width)
    console.print(Panel(f"{x(fit(expl.summary, 4))}\n\n[bold]{x(tx('heading.formula'))}[/]{tx('heading.colon')}"
                        f"{x(expl.formula)}", title=f"[bold]{x(expl.title)}", expand=True), highlight=False)
    for key, text in (("heading.commands", "  |  ".join(expl.commands)), ("heading.settings", settings_text(expl.settings)),
                      ("heading.when", expl.when), ("heading.paper", "; ".join(expl.papers))):
        head = tx(key)
        console.print(f"[bold]{x(head)}[/]{x(fit(head + tx('heading.colon') + text)[len(head):])}", highlight=False)
    if legend(expl, tx):
        console.print(f"[dim]{x(fit(legend(expl, tx)))}[/]", highlight=False)
    for n, step in enumerate(expl.steps, 1):
        console.rule(f"[bold]{n}. {x(step.title)}")
        console.print(f"[cyan]{x(step.formula)}[/]", highlight=False)
        console.print(x(fit(step.text)), highlight=False)
        for value in step.values:
            console.print(f"[bold]{x(value.symbol)}[/] — {x(value.label)}  [dim]{x(provenance(value, tx))}[/]",
                          highlight=False)
            if len(value.rows) == 1 and len(value.rows[0]) == 1:
                console.print(f"  {x(value.symbol)} = {fmt(value.rows[0][0])}", highlight=False)
                continue
            table = Table(show_edge=False, pad_edge=False, box=None, padding=(0, 1))
            table.add_column("")
            for column in value.columns:
                table.add_column(x(column), justify="right")
            for label, row in value_rows(value):
                table.add_row(x(label), *row)
            console.print(table)
    if expl.diagrams:
        console.rule(f"[bold]{x(tx('heading.diagrams'))}")
        for diagram in expl.diagrams:
            console.print(x(fit(f"{diagram.key}.png — {diagram.caption}")), highlight=False)


def _line_breaker(lang: str, width: int):
    """(text, columns taken by a frame) -> the text with its line breaks for `width` columns: Chinese
    broken by cjk_wrap, any other language left to rich."""
    if lang != "zh":
        return lambda text, frame=0: text
    from lmpo.teach.explain.cjk_wrap import wrap_cjk

    return lambda text, frame=0: wrap_cjk(text, width - frame)


# ---------------------------------------------------------------- markdown
def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a literal pipe (|y_w|) would end the cell


def markdown_table(value: Value) -> list[str]:
    lines = [f"| {_cell(value.symbol)} | " + " | ".join(value.columns) + " |",
             "|---|" + "---:|" * len(value.columns)]
    for label, row in value_rows(value):
        lines.append(f"| {_cell(label)} | " + " | ".join(row) + " |")
    return lines


def render_markdown(expl: Explanation, image_prefix: str = f"../{IMAGE_DIR}/") -> str:
    """The page as markdown (docs/methods/LANG/METHOD.md); images under `image_prefix`."""
    tx = Texts(expl.lang)
    other = "zh" if expl.lang == "en" else "en"
    out = [f"# {expl.title}", "",
           f"[{tx('heading.language')}](../{other}/{expl.method}.md) · [{tx('heading.methods')}](../README.md)", "",
           expl.summary, "", f"**{tx('heading.formula')}**{tx('heading.colon')}`{expl.formula}`", "",
           f"## {tx('heading.commands')}", ""]
    out += [f"- `{c}`" for c in expl.commands]
    out += ["", f"**{tx('heading.settings')}**{tx('heading.colon')}`{settings_text(expl.settings)}`", "",
            f"## {tx('heading.when')}", "", expl.when, "", f"## {tx('heading.paper')}", ""]
    out += [f"- {p}" for p in expl.papers]
    out += ["", f"## {tx('heading.example')}", ""] + ([legend(expl, tx), ""] if legend(expl, tx) else [])
    for n, step in enumerate(expl.steps, 1):
        out += [f"### {n}. {step.title}", "", f"`{step.formula}`", "", step.text, ""]
        for value in step.values:
            out += [f"<!-- value: {value.name} -->",
                    f"**{value.symbol}** — {value.label} {provenance(value, tx).replace('|', '/')}", ""]
            out += markdown_table(value) + [""]
    if expl.diagrams:
        out += [f"## {tx('heading.diagrams')}", ""]
        for d in expl.diagrams:
            out += [f"![{d.key}]({image_prefix}{d.key}.png)", "", d.caption, ""]
    return "\n".join(out).rstrip() + "\n"


# ---------------------------------------------------------------- HTML
STYLE = """body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;line-height:1.5}
code,.formula{font-family:ui-monospace,monospace}.formula{background:#f4f4f8;padding:.3rem .6rem;display:block}
table.value{border-collapse:collapse;margin:.4rem 0 1rem}table.value td,table.value th{border:1px solid #ccd;
padding:.15rem .5rem}td.num{text-align:right;font-family:ui-monospace,monospace}.src{color:#666;font-size:.85em}
img{max-width:100%}section.step{border-top:1px solid #dde;margin-top:1.2rem}"""


def html_table(value: Value, tx: Texts) -> str:
    e = html.escape
    head = "".join(f"<th>{e(c)}</th>" for c in value.columns)
    rows = "".join(
        f"<tr><th>{e(label)}</th>" + "".join(f'<td class="num">{e(c)}</td>' for c in row) + "</tr>"
        for label, row in value_rows(value))
    caption = f"<b>{e(value.symbol)}</b> — {e(value.label)} <span class=\"src\">{e(provenance(value, tx))}</span>"
    return (f'<table class="value" data-name="{e(value.name)}"><caption style="text-align:left">{caption}</caption>'
            f"<tr><th>{e(value.symbol)}</th>{head}</tr>{rows}</table>")


def render_html(expl: Explanation, image_prefix: str = f"{IMAGE_DIR}/") -> str:
    tx = Texts(expl.lang)
    e = html.escape
    parts = [f"<!doctype html><html lang=\"{expl.lang}\"><head><meta charset=\"utf-8\"><title>{e(expl.title)}</title>"
             f"<style>{STYLE}</style></head><body>", f"<h1>{e(expl.title)}</h1>", f"<p>{e(expl.summary)}</p>",
             f'<p><b>{e(tx("heading.formula"))}</b>{e(tx("heading.colon"))}<span class="formula">{e(expl.formula)}</span></p>',
             f"<h2>{e(tx('heading.commands'))}</h2><ul>" + "".join(f"<li><code>{e(c)}</code></li>" for c in expl.commands)
             + f"</ul><p><b>{e(tx('heading.settings'))}</b>{e(tx('heading.colon'))}<code>{e(settings_text(expl.settings))}</code></p>",
             f"<h2>{e(tx('heading.when'))}</h2><p>{e(expl.when)}</p>",
             f"<h2>{e(tx('heading.paper'))}</h2><ul>" + "".join(f"<li>{e(p)}</li>" for p in expl.papers) + "</ul>",
             f"<h2>{e(tx('heading.example'))}</h2>" + (f'<p class="src">{e(legend(expl, tx))}</p>' if legend(expl, tx) else "")]
    for n, step in enumerate(expl.steps, 1):
        parts.append(f'<section class="step" data-step="{e(step.key)}"><h3>{n}. {e(step.title)}</h3>'
                     f'<span class="formula">{e(step.formula)}</span><p>{e(step.text)}</p>'
                     + "".join(html_table(v, tx) for v in step.values) + "</section>")
    if expl.diagrams:
        parts.append(f"<h2>{e(tx('heading.diagrams'))}</h2>")
        for d in expl.diagrams:
            parts.append(f'<figure><img src="{e(image_prefix)}{e(d.key)}.png" alt="{e(d.key)}">'
                         f"<figcaption>{e(d.caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def draw_diagrams(expl: Explanation, image_dir: Path, drawn: set[str] | None = None) -> list[Path]:
    """Write the explanation's PNGs into `image_dir` (skipping keys already in `drawn`)."""
    image_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for d in expl.diagrams:
        path = image_dir / f"{d.key}.png"
        if drawn is None or d.key not in drawn:
            d.draw(str(path))
            if drawn is not None:
                drawn.add(d.key)
        paths.append(path)
    return paths


def write_html(expl: Explanation, out_dir: str | Path) -> Path:
    """DIR/METHOD.html (DIR/METHOD.zh.html for Chinese) and its diagrams under DIR/img/."""
    out = Path(out_dir)
    draw_diagrams(expl, out / IMAGE_DIR)
    path = out / (f"{expl.method}.html" if expl.lang == "en" else f"{expl.method}.{expl.lang}.html")
    path.write_text(render_html(expl), encoding="utf-8")
    return path
