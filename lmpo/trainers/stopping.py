"""Stopping rules: run a stage until its held-out score stops improving (or a wall-time cap),
and keep the best model rather than the last.

A fixed step budget tuned on one task is wrong for the next one: too short where the loss is
still falling, wasted where it has flattened. `StopRule` watches the held-out score at each
evaluation (CPT: held-out loss, lower is better; RL: held-out accuracy, higher is better) and
says when `patience` evaluations in a row improved by no more than `min_delta`, or
when `max_minutes` have passed. The trainer keeps a copy of the best weights (`BestWeights`)
and ends with them, so the next stage starts from the best model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from lmpo.models import save_model
from lmpo.trainers.run_clock import RunClock
from lmpo.trainers.run_dir import replace_directory, staging_directory


@dataclass
class StoppingOptions:
    stop_patience: int = 0
    """Stop after this many held-out evaluations in a row without improvement (CPT: loss, RL: accuracy) and keep the best model; 0 = run every step."""
    stop_min_delta: float = 0.0
    """The smallest change in the held-out score that counts as an improvement."""
    max_minutes: float = 0.0
    """Wall-time cap of the stage in minutes: stop at the first evaluation past it, keeping the best model (0 = none); a resumed stage counts the time it trained before."""


def stopping_problems(cfg: StoppingOptions) -> list[str]:
    problems = [f"{n}={getattr(cfg, n)} must be >= 0" for n in ("stop_patience", "stop_min_delta", "max_minutes")
                if getattr(cfg, n) < 0]
    if cfg.stop_min_delta and not cfg.stop_patience:
        problems.append(f"stop_min_delta={cfg.stop_min_delta} is the improvement stop_patience waits for; "
                        f"set stop_patience > 0 too")
    if (cfg.stop_patience or cfg.max_minutes) and getattr(cfg, "fsdp", False):
        problems.append("stopping rules keep the best model from an unsharded copy; not yet with fsdp")
    return problems


@dataclass
class StopRule:
    patience: int
    min_delta: float
    max_seconds: float
    higher_is_better: bool
    best: float | None = None
    best_step: int = 0
    waited: int = 0
    mark: float | None = None
    """The score the last improvement by more than `min_delta` reached: patience counts from it."""
    clock: RunClock = field(default_factory=RunClock)
    """The cap's clock, from the rule's making; kept in `state()`, so a resumed run goes on from it."""

    @classmethod
    def from_options(cls, cfg: StoppingOptions, higher_is_better: bool) -> "StopRule":
        return cls(cfg.stop_patience, cfg.stop_min_delta, 60 * cfg.max_minutes, higher_is_better)

    @property
    def active(self) -> bool:
        return self.patience > 0 or self.max_seconds > 0

    def _gain(self, score: float, over: float | None) -> float:
        if over is None:
            return float("inf")
        return score - over if self.higher_is_better else over - score

    def observe(self, step: int, score: float) -> bool:
        """Record an evaluation; True when it is the best so far (the model to keep). Patience
        restarts only on an improvement by more than `min_delta`, so a slow creep still stops."""
        if self._gain(score, self.mark) > self.min_delta:
            self.mark, self.waited = score, 0
        else:
            self.waited += 1
        if self._gain(score, self.best) > 0:
            self.best, self.best_step = score, step
            return True
        return False

    def reason(self) -> str | None:
        """Why the stage should stop now, or None."""
        if self.patience and self.waited >= self.patience:
            return (f"no improvement over {self.mark:.4g} by more than {self.min_delta:g} in {self.waited} "
                    f"evaluations (best {self.best:.4g} at step {self.best_step})")
        if self.max_seconds and self.clock.seconds() >= self.max_seconds:
            return f"the wall-time cap of {self.max_seconds / 60:g} minutes"
        return None

    def state(self) -> dict:
        return {"best": self.best, "best_step": self.best_step, "waited": self.waited, "mark": self.mark,
                "seconds": self.clock.seconds()}

    def load_state(self, state: dict) -> None:
        self.best, self.best_step, self.waited = state.get("best"), state.get("best_step", 0), state.get("waited", 0)
        self.mark = state.get("mark", self.best)
        self.clock.go_on_from(state.get("seconds"))  # the cap counts the time trained before the resume


class BestWeights:
    """The best model so far, written to `RUN_DIR/best/` (an ordinary model directory, or the
    adapter under LoRA) each time the score improves, so a crash or a resume never loses it."""

    def __init__(self, directory: Path):
        self.directory = directory

    def keep(self, model: torch.nn.Module, tokenizer) -> None:
        # the old copy is moved aside, not deleted, until the new one is in place: a kill at any
        # point leaves one of them, which the next start puts back (`tidy_interrupted_swaps`)
        fresh = staging_directory(self.directory)
        save_model(model, tokenizer, fresh)
        replace_directory(fresh, self.directory)

    def restore(self, model: torch.nn.Module) -> bool:
        """Load the kept weights into `model`; False when none were kept."""
        if not self.directory.is_dir():
            return False
        from lmpo.trainers.checkpoint import load_weights

        load_weights(self.directory, model)
        return True
