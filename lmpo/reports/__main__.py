"""``python -m lmpo.reports RUN_DIR``: write RUN_DIR/report/report.html."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from .report import unfinished_note, write_report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lmpo.reports",
        description="Write PNG plots and report.html for a run or pipeline directory.",
    )
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="directory with metrics.jsonl and/or summary.json")
    args = parser.parse_args(argv)
    status = 0
    for run_dir in args.run_dirs:
        try:
            print(write_report(run_dir))
            note = unfinished_note(Path(run_dir))
            if note:
                print(f"note: {note}")
        except (FileNotFoundError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
