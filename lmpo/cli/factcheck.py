"""`lmpo factcheck`: claims the field repeats, measured, with verdicts computed from the evidence."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "check claims the field repeats by small experiments and exact computations; verdicts from the evidence"
DESCRIPTION = """Check claims the field repeats about GRPO, PPO, DPO and their relatives. Each claim is a small
experiment (real lmpo training runs from the embedded task's SFT checkpoint) or an exact computation
(lmpo's own loss and advantage functions); its verdict (holds / does not hold / depends) is computed
from the measured numbers by a stated criterion. Prints a table and writes DIR/factcheck.html and
DIR/factcheck.json. The whole set takes a few minutes on a 2-core CPU; --fast runs only the exact
computations (seconds)."""


def add_parser(sub) -> None:
    p = sub.add_parser("factcheck", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default=None, metavar="NAMES",
                   help="comma-separated claim names (see --list); default: all")
    p.add_argument("--fast", action="store_true", help="only the exact computations, no training")
    p.add_argument("--out", default="factcheck", metavar="DIR",
                   help="directory for factcheck.html, factcheck.json, plots/, runs/, logs/ (default: factcheck)")
    p.add_argument("--threads", type=int, default=2, metavar="T",
                   help="torch CPU threads for training and computation (0 = one per core; default 2)")
    p.add_argument("--lang", choices=["en", "zh"], default="en", help="language of the report (default: en)")
    p.add_argument("--seed", type=int, default=0, help="seed of the SFT start and the experiments (default 0)")
    p.add_argument("--list", action="store_true",
                   help="list the claims (those --only and --fast select, when given) and exit")
    p.set_defaults(func=cmd_factcheck)


def cmd_factcheck(args: argparse.Namespace, flags: dict) -> int:
    from lmpo.teach.factcheck import FactcheckOptions, progress_line, run_factcheck
    from lmpo.teach.factcheck.core import fill
    from lmpo.teach.factcheck.texts import ui

    if args.only is not None and not args.only.replace(",", "").strip():  # `--only ""`: all claims would run
        from lmpo.teach.refusals import refusal

        raise ValueError(refusal("factcheck.only_empty", args.lang, only=args.only))
    if args.list:
        return _list(args)
    options = FactcheckOptions(only=args.only or "", fast=args.fast, out=args.out, threads=args.threads, lang=args.lang,
                               seed=args.seed)
    report = run_factcheck(options, on_outcome=lambda i, n, outcome: progress_line(i, n, outcome, args.lang), show=True)
    words = ui(args.lang)
    if report.start_seconds > 5:
        print(fill(words["start_trained"], {"seconds": report.start_seconds}))
    out = Path(args.out)  # `--out ''` is the current directory, not the root the text f"{out}/..." named
    print(fill(words["outputs"], {"html": out / "factcheck.html", "json": out / "factcheck.json"}))
    return 1 if any(o.error for o in report.outcomes) else 0


def _list(args: argparse.Namespace) -> int:
    """The claims a run with the same --only and --fast would check (a misspelt --only name is
    refused, as it is for a run), in --lang, each kind as the report's table words it."""
    from lmpo.teach.factcheck import select, skipped_by_fast
    from lmpo.teach.factcheck.texts import claim_texts, ui
    from lmpo.teach.refusals import refusal

    claims = select(args.only or "", args.fast, args.lang)
    if not claims:
        raise ValueError(refusal("factcheck.fast_none", args.lang,
                                 names=", ".join(skipped_by_fast(args.only or "", args.fast))))
    words = ui(args.lang)
    for claim in claims:
        print(f"{claim.name:26s} {words['fast' if claim.fast else 'slow']}  {claim_texts(claim, args.lang)['text']}")
    return 0
