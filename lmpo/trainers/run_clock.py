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


# A run stopped by its wall-time cap before its last step finishes (model/, result.json) and, when
# it checkpoints, writes a checkpoint at the step it stopped at, named in result.json under this
# key; `--resume RUN --max_minutes M` then continues it as if it had never stopped.
CAP_RECORD = "time_cap"


def cap_record(step: int, steps: int, max_minutes: float, checkpointed: bool) -> dict:
    """result.json's note of a stop at the cap: after `step` of `steps`, and whether it can go on."""
    return {CAP_RECORD: {"step": step, "steps": steps, "max_minutes": max_minutes, "checkpoint": checkpointed}}


def continued_cap(run_dir, max_minutes: float) -> dict | None:
    """For `--resume` of a finished run: its cap record when it stopped at its wall-time cap with a
    checkpoint of that step, the newest (it then goes on from there); None when it did not stop so.
    Raises RunDirError when it did but cannot go on, or `max_minutes` leaves it no time."""
    import json
    from pathlib import Path

    from lmpo.trainers.run_dir import RunDirError, complete_checkpoints

    try:
        cap = json.loads((Path(run_dir) / "result.json").read_text()).get(CAP_RECORD)
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(cap, dict):
        return None
    done = complete_checkpoints(run_dir)
    if not cap.get("checkpoint") or not done or done[-1].name != f"step_{cap['step']:06d}":
        raise RunDirError(f"--resume {run_dir}: that run stopped at its wall-time cap after step {cap['step']} of "
                         f"{cap['steps']} without a checkpoint of that step (--save_every 0), so it cannot go on; "
                         f"train its model further with a new run (--model {Path(run_dir) / 'model'})")
    spent = _seconds_at(done[-1])
    if max_minutes and spent is not None and 60 * max_minutes <= spent:
        raise RunDirError(f"--resume {run_dir}: that run stopped at its wall-time cap of {cap['max_minutes']:g} minutes "
                         f"after step {cap['step']} of {cap['steps']}, {spent / 60:.2f} minutes of training; "
                         f"--max_minutes counts those too, so give more than {spent / 60:.2f} (or 0: no cap)")
    return cap


def _seconds_at(checkpoint) -> float | None:
    import json

    try:
        return json.loads((checkpoint / "state.json").read_text()).get(STATE_KEY)
    except (OSError, ValueError, AttributeError):
        return None
