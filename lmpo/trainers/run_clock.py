"""A run's wall clock, carried through `--resume`.

`--max_minutes` caps a stage's wall time, and `elapsed_s` (metrics) and `seconds` (result.json)
report it. A resumed run goes on from the time its checkpoint recorded: the checkpoint keeps
`seconds()` as of its writing, and the resumed process's clock starts from that value once the
checkpoint is loaded (its own start-up, model loading included, is not counted again: the
uninterrupted run loaded once), so a resumed run stops where the uninterrupted one would.
"""

from __future__ import annotations

import time

STATE_KEY = "elapsed_s"  # in a checkpoint's state.json: the run's seconds when it was written


class RunClock:
    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.before = 0.0
        """Seconds the run had trained before this process took it over (0 for a fresh run)."""

    def seconds(self) -> float:
        return self.before + time.perf_counter() - self.started

    def go_on_from(self, seconds: float | None) -> None:
        """Count `seconds` already trained, and the time from now on; None (a checkpoint written
        before the clock was kept) leaves the clock as it is."""
        if seconds is not None:
            self.before, self.started = float(seconds), time.perf_counter()

    def resume(self, resumed) -> None:
        """Go on from the seconds a loaded checkpoint (`Resumed`; None: a fresh run) recorded."""
        self.go_on_from(resumed.state.get(STATE_KEY) if resumed is not None else None)
