"""Generate docs/methods: a markdown page per method per language, the diagrams, and an index.

    python -m lmpo.teach.explain.docs docs/methods      (or: lmpo explain --all --docs docs/methods)

The pages are committed; a test regenerates them and fails when they differ from the generator.
"""

from __future__ import annotations

import sys
from pathlib import Path

from lmpo.teach.explain import LANGS, METHODS, explain
from lmpo.teach.explain.model import Explanation
from lmpo.teach.explain.page import Texts
from lmpo.teach.explain.render import IMAGE_DIR, draw_diagrams, render_markdown


def explanations() -> dict[tuple[str, str], Explanation]:
    return {(lang, method): explain(method, lang) for lang in LANGS for method in METHODS}


def index_page(pages: dict[tuple[str, str], Explanation]) -> str:
    """docs/methods/README.md: every method, in both languages."""
    out = []
    for lang in LANGS:
        tx = Texts(lang)
        out += [f"## {tx('heading.methods')} ({lang})", "", tx("heading.index_intro"), ""]
        out += [f"- [{pages[lang, m].title}]({lang}/{m}.md)" for m in METHODS]
        out.append("")
    return "# lmpo — methods / 方法\n\n" + "\n".join(out).rstrip() + "\n"


def render_docs(pages: dict[tuple[str, str], Explanation] | None = None) -> dict[str, str]:
    """Relative path → text of every generated markdown file."""
    pages = pages or explanations()
    files = {f"{lang}/{method}.md": render_markdown(expl) for (lang, method), expl in pages.items()}
    files["README.md"] = index_page(pages)
    return files


def image_names(pages: dict[tuple[str, str], Explanation]) -> set[str]:
    return {f"{IMAGE_DIR}/{d.key}.png" for expl in pages.values() for d in expl.diagrams}


def write_docs(out_dir: str | Path, draw: bool = True) -> list[Path]:
    """Write every page (and, with `draw`, every diagram) under `out_dir`; returns the paths."""
    out = Path(out_dir)
    pages = explanations()
    written = []
    for rel, text in render_docs(pages).items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    if draw:
        drawn: set[str] = set()
        for expl in pages.values():
            written += [p for p in draw_diagrams(expl, out / IMAGE_DIR, drawn) if p not in written]
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m lmpo.teach.explain.docs OUT_DIR", file=sys.stderr)
        return 2
    paths = write_docs(args[0])
    print(f"wrote {len(paths)} files under {args[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
