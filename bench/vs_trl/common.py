"""What both bench workers share (no lmpo and no TRL imports: the TRL worker runs in TRL's own
environment): the step protocol over stdin/stdout, peak RSS, thread pinning.

A worker loads its trainer, runs its warm-up step, prints `READY`, then for each `step` line on
stdin runs exactly one training step and prints one JSON line of timings; `quit` ends it. When it
is blocked on the next line it says so (`idle`, with the seconds its trainer spent between the
step's end and the wait: logging, the next batch). The driver alternates the two workers step by
step and starts one only when the other is idle, so each pair of steps sees the same machine and
neither side's between-step work runs inside the other's step."""

from __future__ import annotations

import json
import os
import resource
import sys
import time

PREFIX = "@@bench "  # result lines; everything else a trainer prints is ignored


def pin_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)


def peak_rss_mb() -> float:
    """The worker's own peak resident memory (Linux `VmHWM`), as `lmpo.models.peak_rss_mb` reads
    it (this file imports no lmpo): `ru_maxrss` would carry the driver's peak into the worker."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


_last_emit = [time.perf_counter()]


def emit(obj: dict) -> None:
    sys.stdout.write(PREFIX + json.dumps(obj) + "\n")
    sys.stdout.flush()
    _last_emit[0] = time.perf_counter()


def wait_for_step() -> str:
    """Say `idle`, then block until the driver asks for the next step and return its line
    (`step`, or `step profile`); exit on `quit` or a closed pipe."""
    emit({"idle": True, "after_step_s": time.perf_counter() - _last_emit[0]})
    line = sys.stdin.readline()
    if not line or line.strip() == "quit":
        sys.stdout.flush()
        os._exit(0)
    return line.strip()


class StepClock:
    """Wall time of one step, the named phases inside it (`add`), and the process's CPU time
    (all its threads: steadier than wall time on a machine others are using)."""

    def __init__(self):
        self.start = time.perf_counter()
        self.cpu_start = time.process_time()
        self.faults_start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        self.phases: dict[str, float] = {}
        self.tokens: dict[str, int] = {}

    def add(self, name: str, seconds: float) -> None:
        self.phases[name] = self.phases.get(name, 0.0) + seconds

    def result(self, **extra) -> dict:
        return {"step_s": time.perf_counter() - self.start, "cpu_s": time.process_time() - self.cpu_start,
                **{f"{k}_s": v for k, v in self.phases.items()},
                **self.tokens, "peak_rss_mb": peak_rss_mb(),
                "minor_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - self.faults_start, **extra}


def timed(clock_ref: list, name: str, fn):
    """`fn` wrapped so its time adds to phase `name` of the current clock (`clock_ref[0]`)."""
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            if clock_ref[0] is not None:
                clock_ref[0].add(name, time.perf_counter() - start)
    return wrapper
