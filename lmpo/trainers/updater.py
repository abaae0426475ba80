"""`Updater`: the one place where a loss becomes an optimizer step (backward, clipping, the
non-finite skip and its streak limit, the step and the schedule)."""

from __future__ import annotations

import math

import torch

from lmpo.trainers.runtime import grad_norm_and_clip


class NonFiniteUpdates(RuntimeError):
    """`max_nonfinite_steps` consecutive steps had a non-finite loss or gradient, all skipped."""


class Updater:
    """Turns losses into optimizer steps. A step whose loss or gradient norm is not finite never
    reaches the weights: its gradients are dropped and it is counted; `patience` consecutive
    skipped steps stop the run with an error naming the metrics file. `step_schedule=False`: the
    trainer moves the schedule itself (online DPO, by rounds)."""

    def __init__(self, optimizer, scheduler, grad_clip: float, patience: int, where: str, unit: str = "steps",
                 step_schedule: bool = True):
        self.optimizer, self.scheduler, self.grad_clip = optimizer, scheduler, grad_clip
        self.step_schedule = step_schedule
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        self.patience, self.where, self.unit = patience, where, unit
        self.skipped = self.streak = 0

    def zero(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def apply(self, loss_finite: bool = True) -> tuple[bool, float]:
        """Clip, then step (or skip a non-finite update); returns (applied, norm before clipping)."""
        grad_norm = grad_norm_and_clip(self.params, self.grad_clip)
        if not (loss_finite and math.isfinite(grad_norm)):
            self.zero()
            self.skipped += 1
            self.streak += 1
            return False, grad_norm
        self.optimizer.step()
        if self.step_schedule:
            self.scheduler.step()
        self.streak = 0
        return True, grad_norm

    def step(self, loss: torch.Tensor) -> tuple[bool, float]:
        """zero → backward → clip → step (or skip) for one loss."""
        self.zero()
        loss.backward()
        return self.apply(math.isfinite(loss.item()))

    @property
    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def check(self, step: int, streak: int | None = None) -> None:
        """Raise once `patience` consecutive steps were skipped (`streak` when a trainer counts
        its own steps, e.g. RL steps of several updates)."""
        streak = self.streak if streak is None else streak
        if streak >= self.patience:
            lr = self.optimizer.param_groups[0]["lr"]
            peak = (getattr(self.scheduler, "base_lrs", None) or [lr])[0]
            raise NonFiniteUpdates(f"[{self.where}] step {step}: the loss or gradients were not finite in {streak} "
                                   f"consecutive {self.unit}; every update was skipped, so the weights are unchanged "
                                   f"since step {step - streak}. The learning rate was {lr:g} (--lr {peak:g}): a "
                                   "lower --lr is the usual remedy (the metrics file's rows show where the loss left "
                                   "the finite range)")

    def state(self) -> dict:
        return {"skipped_updates": self.skipped, "nonfinite_streak": self.streak}

    def load_state(self, state: dict) -> None:
        self.skipped, self.streak = state.get("skipped_updates", 0), state.get("nonfinite_streak", 0)
