"""SIGTERM ends a run at its next step boundary, with a checkpoint there, instead of mid-step.

Schedulers (SLURM, Kubernetes, a spot instance's notice) send SIGTERM and wait a grace period
before SIGKILL. Inside `stop_at_next_step()` (`lmpo train` enters it for a run that checkpoints,
`save_every` > 0, in one process) the signal only marks the request: the trainer finishes the
step it is in, writes a checkpoint after it whatever `save_every` says (`Run.checkpoint_due`),
and raises `Preempted`, which the CLI reports with the `--resume` command that continues the
run (exit code 143, 128 + SIGTERM). The last step itself is not interrupted: the run finishes.
A second SIGTERM kills at once, as without this. Under torchrun the processes would have to
agree on the step first, so there SIGTERM keeps its default meaning.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path

_requested = threading.Event()


class Preempted(Exception):
    """A run stopped by SIGTERM after writing a checkpoint at `step`."""

    def __init__(self, step: int, checkpoint: Path):
        super().__init__(f"stopped by SIGTERM after step {step}; checkpoint {checkpoint} written")
        self.step, self.checkpoint = step, checkpoint


def stop_requested() -> bool:
    return _requested.is_set()


def _on_sigterm(signum, frame) -> None:
    if _requested.is_set():  # asked twice: go now, as SIGTERM does by default
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    _requested.set()  # no printing here: the signal may land inside a write to the same stream


@contextlib.contextmanager
def stop_at_next_step(enabled: bool = True):
    """SIGTERM asks the run to stop after its current step (see the module docstring). Signal
    handlers belong to the main thread: elsewhere, or not `enabled`, SIGTERM is left alone."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _requested.clear()
