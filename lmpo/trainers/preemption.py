"""SIGTERM ends a run at its next step boundary, with a checkpoint there, instead of mid-step.

Schedulers (SLURM, Kubernetes, a spot instance's notice) send SIGTERM and wait a grace period
before SIGKILL. Inside `stop_at_next_step()` (`lmpo train` enters it for a run that checkpoints,
`save_every` > 0, in one process) the signal only marks the request: the trainer finishes the
step it is in, writes a checkpoint after it whatever `save_every` says (`Run.checkpoint_due`),
and raises `Preempted`, which the CLI reports with the `--resume` command that continues the
run (exit code 143, 128 + SIGTERM). The last step itself is not interrupted: the run finishes.
A second SIGTERM kills at once, as without this. Under torchrun the processes would have to
agree on the step first, so there SIGTERM keeps its default meaning.

`lmpo pipeline` runs stages that checkpoint and parts that do not (a stage with `save_every` 0,
the doctor and report between stages): around the whole pipeline `sigterm_interrupts()` makes
SIGTERM unwind as Ctrl-C does (`Terminated`, exit 143) so the pipeline can say where it stopped,
and each stage that checkpoints arms `stop_at_next_step()` inside it.
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


class Terminated(KeyboardInterrupt):
    """SIGTERM where no checkpoint was armed: unwinds as Ctrl-C does (every cleanup of an
    interrupted run applies), and the CLI exits 143 (128 + SIGTERM)."""


def stop_requested() -> bool:
    return _requested.is_set()


def _on_sigterm(signum, frame) -> None:
    if _requested.is_set():  # asked twice: go now, as SIGTERM does by default
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    _requested.set()  # no printing here: the signal may land inside a write to the same stream


def _raise_terminated(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM, during the unwinding, kills at once
    raise Terminated()


@contextlib.contextmanager
def sigterm_interrupts(enabled: bool = True):
    """SIGTERM raises `Terminated` in the main thread (see the module docstring); the handler
    before is restored after. Not `enabled`, or off the main thread, SIGTERM is left alone."""
    with _sigterm_handler(_raise_terminated, enabled):
        yield


@contextlib.contextmanager
def stop_at_next_step(enabled: bool = True):
    """SIGTERM asks the run to stop after its current step (see the module docstring). Signal
    handlers belong to the main thread: elsewhere, or not `enabled`, SIGTERM is left alone."""
    try:
        with _sigterm_handler(_on_sigterm, enabled):
            yield
    finally:
        _requested.clear()


@contextlib.contextmanager
def _sigterm_handler(handler, enabled: bool):
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
