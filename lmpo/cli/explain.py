"""`lmpo explain METHOD`: a method worked through on small numbers by the library's own functions."""

from __future__ import annotations

import argparse

from lmpo.teach.refusals import ready_out, refusal

HELP = ("work a method through a small numeric example computed by lmpo.algos: print it step by step "
        "and write an HTML page with diagrams")

PAGE_LINE = {"en": "page: {path}", "zh": "页面：{path}"}
"""The line naming the HTML page written, in the language of the page."""
DOCS_LINE = {"en": "wrote {n} files under {dir}", "zh": "在 {dir} 下写了 {n} 个文件"}


def add_parser(sub) -> None:
    from lmpo.teach.explain.settings import METHODS  # names only: no torch

    p = sub.add_parser("explain", help=HELP, description=HELP + ". Methods: " + ", ".join(METHODS) + ".")
    p.add_argument("method", nargs="?", default=None, metavar="METHOD", help="method to explain (none: list them)")
    p.add_argument("--lang", choices=["en", "zh"], default="en", help="language of the prose (default en)")
    p.add_argument("--out", default="explain", metavar="DIR",
                   help="directory of the HTML page and its diagrams (default explain/)")
    p.add_argument("--list", action="store_true", help="list the methods")
    p.add_argument("--all", action="store_true", help="every method: HTML pages in --out, or markdown with --docs")
    p.add_argument("--docs", default=None, metavar="DIR",
                   help="with --all: write the markdown documentation (both languages) into DIR, e.g. docs/methods")
    p.set_defaults(func=cmd_explain)


def cmd_explain(args: argparse.Namespace, flags: dict) -> int:
    from lmpo.teach.explain import METHODS

    if args.docs and not args.all:
        raise ValueError(refusal("explain.docs_without_all", args.lang))
    given = [what for what, on in ((f"METHOD ({args.method})", args.method is not None), ("--list", args.list),
                                   ("--all", args.all)) if on]
    if len(given) > 1:
        raise ValueError(refusal("explain.several", args.lang, given=" and ".join(given)))
    if args.all:
        if args.docs:
            ready_out(args.docs, args.lang, "--docs")
        else:
            ready_out(args.out, args.lang)
        return _all(args)
    if args.list or args.method is None:
        return _list(args.lang)
    if args.method not in METHODS:
        from lmpo.teach.names import did_you_mean

        raise ValueError(refusal("unknown_method", args.lang, name=args.method,
                                 hint=did_you_mean(args.method, METHODS, args.lang), names=", ".join(METHODS)))
    ready_out(args.out, args.lang)
    from rich.console import Console

    from lmpo.teach.explain import explain
    from lmpo.teach.explain.render import render_terminal, write_html

    expl = explain(args.method, args.lang)
    page = write_html(expl, args.out)  # before the terminal text, which `| head` may cut short
    render_terminal(expl, Console())
    print(PAGE_LINE[args.lang].format(path=page))
    return 0


def _list(lang: str) -> int:
    from lmpo.teach.explain import METHODS
    from lmpo.teach.explain.page import Texts

    tx = Texts(lang)
    for method in METHODS:
        print(f"{method:13s} {tx(f'{method}.title')}")
    print("\nlmpo explain METHOD [--lang en|zh] [--out DIR]")
    return 0


def _all(args: argparse.Namespace) -> int:
    if args.docs:
        from lmpo.teach.explain.docs import write_docs

        paths = write_docs(args.docs)
        print(DOCS_LINE[args.lang].format(n=len(paths), dir=args.docs))
        return 0
    from lmpo.teach.explain import METHODS, explain
    from lmpo.teach.explain.render import write_html

    for method in METHODS:
        print(PAGE_LINE[args.lang].format(path=write_html(explain(method, args.lang), args.out)))
    return 0
