"""Tiny self-contained HTML builder (no external CSS or JS)."""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence
from urllib.parse import quote

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1000px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { margin-top: 1.8em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.92em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.7em; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f3f3f3; }
figure { margin: 1.2em 0; } img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #666; font-size: 0.85em; }
.note { color: #a33; }
"""


# C0 and C1 control characters and DEL, but not newline and tab: in text a run logged (tool output,
# model text) an ESC or BEL would drive the reader's terminal (clear it, retitle it, recolour it).
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def show_controls(text: str) -> str:
    """``text`` with each control character other than newline and tab written as ``\\xNN``."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def esc(text: object) -> str:
    return html.escape(show_controls(str(text)), quote=True)


def src(path: str) -> str:
    """A relative POSIX path made safe for an ``src``/``href`` attribute."""
    return esc(quote(path, safe="/._-"))


def document(title: str, body: Iterable[str], lang: str = "en") -> str:
    """The page; `lang`: the language of its words (its <html lang>)."""
    parts = "\n".join(body)
    return (
        f"<!DOCTYPE html>\n<html lang=\"{esc(lang)}\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{esc(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        f"<h1>{esc(title)}</h1>\n{parts}\n</body>\n</html>\n"
    )


def heading(text: str, level: int = 2) -> str:
    return f"<h{level}>{esc(text)}</h{level}>"


def paragraph(text: str, css_class: str = "") -> str:
    cls = f' class="{esc(css_class)}"' if css_class else ""
    return f"<p{cls}>{esc(text)}</p>"


def link(href: str, text: str) -> str:
    return f'<a href="{src(href)}">{esc(text)}</a>'


def cell(value: object, numeric: bool = False, raw_html: bool = False) -> str:
    body = str(value) if raw_html else esc(value)
    return f'<td class="num">{body}</td>' if numeric else f"<td>{body}</td>"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """``rows`` hold ready-made ``<td>`` cells (see :func:`cell`)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "\n".join(f"<tr>{''.join(r)}</tr>" for r in rows)
    return f"<table>\n<tr>{head}</tr>\n{body}\n</table>"


def image(path: str, caption: str = "") -> str:
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return f'<figure><img src="{src(path)}" alt="{esc(caption or path)}">{cap}</figure>'
