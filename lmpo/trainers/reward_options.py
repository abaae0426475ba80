"""The reward options every trainer that scores its own samples shares (RL, online DPO, RFT)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class RewardOptions:
    rewards: str = "correct=1.0"
    """Reward functions and weights, e.g. `correct=1.0,format=0.1`; `rm=1.0` uses `reward_model`; your own as `module:function=1.0` or `path/to/file.py:function=1.0`."""
    reward_model: str = ""
    """Directory of a trained reward model (`lmpo train rm`) for the `rm` reward."""
    reward_timeout: float = 60.0
    """Seconds a reward function may take per call; the reward model and your own functions each run in their own process, killed when it overruns (0 = call them in this process, without a timeout and without isolation: a function that calls os._exit ends the run, exit status and all, before anything is saved, and one can change the problems the trainer keeps). The built-in graders always run in this process."""
    reward_failure: Literal["unscorable", "error"] = "unscorable"
    """When a reward raises, times out or returns None/NaN: mark the sample unscorable (never used as a right answer, counted in the metrics) or stop with an error naming the prompt and the function."""
    max_unscorable_steps: int = 3
    """Stop with an error when every sample was unscorable in this many consecutive steps or rounds (0 = never); the reasons are in `reward_failures.jsonl`."""
    reward_memory_mb: int = 4096
    """Memory limit of each reward worker process in MiB (an allocation past it fails and makes the samples unscorable, with that reason)."""
