"""SIGTERM ends a run at its next step boundary, with a checkpoint there, instead of mid-step.

Schedulers (SLURM, Kubernetes, a spot instance's notice) send SIGTERM and wait a grace period
before SIGKILL. Inside `stop_at_next_step()` (`lmpo train` enters it for a run that checkpoints,
`save_every` > 0, in one process) the signal only marks the request: the trainer finishes the
step it is in, writes a checkpoint after it whatever `save_every` says (`Run.checkpoint_due`),
and raises `Preempted`, which the CLI reports with the `--resume` command that continues the
run (exit code 143, 128 + SIGTERM). The last step itself is not interrupted: the run finishes.
A second SIGTERM kills at once, as without this. A run whose step cannot end because a user's
code never returns (an environment without `env_timeout`, a task's grader: `lmpo.envs.user_calls`)
is stopped without finishing it, `STUCK_GRACE_S` after the signal: one line names the call, and
the run unwinds as after Ctrl-C (its newest complete checkpoint is where `--resume` goes on), exit
143; a call that does not give way to that either (it swallows the exception) ends the process
another `STUCK_GRACE_S` later. Under torchrun the processes would have to
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
import sys
import threading
import time
from pathlib import Path

from lmpo.envs import user_calls

_requested = threading.Event()
STUCK_GRACE_S = 10.0
"""How long a call of user code may go on after SIGTERM before the run stops without its step:
within the 30 s schedulers commonly wait before SIGKILL (Kubernetes, SLURM's KillWait)."""
_stuck: list = []  # the call a run was stopped in, once the watch below gave up on it


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
    if _stuck:  # sent by `_stop_if_stuck`: unwind out of the call that does not return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise Terminated()
    if _requested.is_set():  # asked twice: go now, as SIGTERM does by default
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    _requested.set()  # no printing here: the signal may land inside a write to the same stream
    threading.Thread(target=_stop_if_stuck, args=(threading.main_thread().ident, time.monotonic()),
                     name="lmpo-sigterm", daemon=True).start()


def _stop_if_stuck(main: int, asked: float, grace_s: float | None = None) -> None:
    """While the run has not stopped: once one call of user code has gone on `grace_s` since the
    signal, say so and interrupt the main thread; kill the process if the call goes on anyway.
    Before, a step that never ended left the first SIGTERM without effect."""
    grace_s = STUCK_GRACE_S if grace_s is None else grace_s
    while _requested.is_set():
        call = user_calls.current()
        if call is not None and time.monotonic() - max(call[1], asked) >= grace_s:
            _stuck.append(call)
            print(f"lmpo: SIGTERM: {call[0]()} has not returned {grace_s:g} s after the signal; the run stops "
                  f"without finishing its step", file=sys.stderr, flush=True)
            signal.pthread_kill(main, signal.SIGTERM)
            time.sleep(grace_s)
            if user_calls.current() is call:  # it swallowed the interruption (or waits in C code that lets
                # no Python handler run): SIGTERM, whose handler is Python's, would not end it
                print(f"lmpo: SIGTERM: {call[0]()} did not give way to the interruption either; the process "
                      f"ends (exit 143)", file=sys.stderr, flush=True)
                user_calls.unwatched()
                os._exit(143)  # this thread runs no user code: the real one
            return
        time.sleep(min(0.25, grace_s / 4))


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
        _stuck.clear()


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
