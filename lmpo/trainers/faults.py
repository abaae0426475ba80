"""Fault injection for crash tests: `LMPO_KILL_AT=checkpoint_write:4,epoch_end:6` makes the run
SIGKILL itself when it reaches one of those points, so a test can check that `--resume`
continues exactly where an uninterrupted run would be.

Points: `after_rollout` (RL: sampled and scored, not yet updated), `checkpoint_write` (weights
written, the checkpoint not yet complete), `epoch_end` (the last batch of an epoch is done),
`step_end` (a step and its checkpoint are done). Unset, a point costs one dictionary lookup.

`LMPO_TERM_AT=after_rollout:3` sends the run SIGTERM there instead, and it goes on: how a
scheduler's notice lands mid-step (see `lmpo.trainers.preemption`).

`LMPO_PAUSE_AT=step_end:3` with `LMPO_PAUSE_FILE=PATH` makes the run stop at that point
instead: it writes its pid to PATH and waits there until it is killed. A test that kills a
run "from outside" waits for PATH, so the kill lands at a point the run cannot pass, however
fast or slow the machine is.
"""

from __future__ import annotations

import os
import signal
import time

ENV, TERM_ENV = "LMPO_KILL_AT", "LMPO_TERM_AT"
PAUSE_ENV, PAUSE_FILE_ENV = "LMPO_PAUSE_AT", "LMPO_PAUSE_FILE"


def fault_point(name: str, step: int) -> None:
    targets = os.environ.get(ENV)
    if targets and f"{name}:{step}" in targets.split(","):
        os.kill(os.getpid(), signal.SIGKILL)
    term = os.environ.get(TERM_ENV)
    if term and f"{name}:{step}" in term.split(","):
        os.kill(os.getpid(), signal.SIGTERM)
    pause = os.environ.get(PAUSE_ENV)
    if pause and f"{name}:{step}" in pause.split(","):
        _pause_until_killed(os.environ[PAUSE_FILE_ENV])


def _pause_until_killed(path: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.replace(tmp, path)  # the waiting test sees a complete file
    while True:
        time.sleep(60)
