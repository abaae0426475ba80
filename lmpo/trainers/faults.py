"""Fault injection for crash tests: `LMPO_KILL_AT=checkpoint_write:4,epoch_end:6` makes the run
SIGKILL itself when it reaches one of those points, so a test can check that `--resume`
continues exactly where an uninterrupted run would be.

Points: `after_rollout` (RL: sampled and scored, not yet updated), `checkpoint_write` (weights
written, the checkpoint not yet complete), `epoch_end` (the last batch of an epoch is done),
`step_end` (a step and its checkpoint are done). Unset, a point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "LMPO_KILL_AT"


def fault_point(name: str, step: int) -> None:
    targets = os.environ.get(ENV)
    if targets and f"{name}:{step}" in targets.split(","):
        os.kill(os.getpid(), signal.SIGKILL)
