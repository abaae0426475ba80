"""A terminal progress bar with the key figures of a stage (rich)."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class StageProgress:
    def __init__(self, name: str, total: int, initial: int = 0, quiet: bool = False, unit: str = "step"):
        """`quiet`: no output at all (a data-parallel run's other ranks). `unit`: what is counted, in
        the plain lines written without a terminal."""
        self.console = Console(stderr=True)
        self.progress = Progress(
            TextColumn(f"[bold]{name}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[figures]}"),
            console=self.console, transient=False, disable=quiet or not sys.stderr.isatty(),
        )
        self.task = self.progress.add_task(name, total=total, completed=initial, figures="")
        self.name, self.total = name, total
        self.every = max(1, total // 10)  # without a terminal, a plain line every 10%
        self.quiet, self.unit = quiet, unit

    def __enter__(self) -> "StageProgress":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def update(self, step: int, **figures: float | None) -> None:
        """`figures` of this step; None is one it has not (a reward where nothing was scorable): n/a."""
        text = "  ".join(f"{k} {v:.3g}" if v is not None else f"{k} n/a" for k, v in figures.items())
        self.progress.update(self.task, completed=step, figures=text)
        if self.progress.disable and not self.quiet and (step % self.every == 0 or step == self.total):
            print(f"[{self.name}] {self.unit} {step}/{self.total}  {text}", file=sys.stderr, flush=True)
