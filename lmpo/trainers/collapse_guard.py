"""A collapse guard for RL: alarms on the signs that a run has gone wrong, and a rollback to the
last complete checkpoint with a lower learning rate instead of training on from a broken policy.

Alarms, each read from the step's metrics row (all figures already averaged over processes):
- entropy collapse: token entropy below `entropy_ratio` × the first step's entropy;
- KL runaway: the KL to the reference above `kl_max`;
- reward drop: the mean reward of the last `window` steps more than `reward_drop` below the best
  such mean seen;
- non-finite updates: every update of `nonfinite_steps` consecutive steps skipped.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class GuardOptions:
    collapse_guard: bool = False
    """Roll back to the last complete checkpoint, with the learning rate multiplied by guard_lr_factor, when entropy collapses, the KL runs away, the reward drops or updates keep failing (needs save_every > 0)."""
    guard_entropy_ratio: float = 0.1
    """Alarm when token entropy falls below this fraction of the first step's."""
    guard_kl_max: float = 1.0
    """Alarm when the KL to the reference exceeds this (nats per token)."""
    guard_reward_drop: float = 0.5
    """Alarm when the mean reward over guard_window steps falls this far below its best."""
    guard_window: int = 10
    """Steps in the reward average the reward-drop alarm compares."""
    guard_lr_factor: float = 0.5
    """Each rollback multiplies the learning rate by this."""
    guard_max_rollbacks: int = 3
    """Stop with an error after this many rollbacks."""


class CollapseGuardStop(RuntimeError):
    """The guard alarmed and has nothing left to try: no checkpoint to go back to, or as many
    rollbacks as allowed did not help."""


def guard_problems(cfg: GuardOptions) -> list[str]:
    problems = []
    if not cfg.collapse_guard:  # the guard's own options without it would be ignored in silence
        defaults = GuardOptions()
        return [f"{name}={getattr(cfg, name)} tunes the collapse guard, which is off: set collapse_guard true"
                for name in vars(defaults) if name != "collapse_guard" and getattr(cfg, name) != getattr(defaults, name)]
    if not 0 < cfg.guard_lr_factor < 1:
        problems.append(f"guard_lr_factor={cfg.guard_lr_factor} must be in (0, 1)")
    if not 0 < cfg.guard_entropy_ratio < 1:
        problems.append(f"guard_entropy_ratio={cfg.guard_entropy_ratio} must be in (0, 1)")
    problems += [f"{n}={getattr(cfg, n)} must be >= 1" for n in ("guard_window", "guard_max_rollbacks")
                 if getattr(cfg, n) < 1]
    if not getattr(cfg, "save_every", 1):
        problems.append("collapse_guard rolls back to a checkpoint: save_every must be > 0")
    return problems


@dataclass
class CollapseGuard:
    options: GuardOptions
    first_entropy: float | None = None
    rewards: deque = field(default_factory=deque)
    best_reward_mean: float | None = None
    rollbacks: int = 0
    lr_scale: float = 1.0
    last_target: object | None = None

    def check(self, row: dict, nonfinite_streak: int, nonfinite_limit: int) -> str | None:
        """The alarm this step raises, in words, or None."""
        o = self.options
        if nonfinite_streak >= nonfinite_limit:
            return f"every update of {nonfinite_streak} consecutive steps was non-finite"
        entropy = row.get("entropy")
        if entropy is not None:
            if self.first_entropy is None:
                self.first_entropy = entropy
            elif entropy < o.guard_entropy_ratio * self.first_entropy:
                return (f"entropy collapse: entropy {entropy:.4f} < {o.guard_entropy_ratio:g} x the first step's "
                        f"{self.first_entropy:.4f}")
        if row.get("kl") is not None and row["kl"] > o.guard_kl_max:
            return f"KL runaway: kl {row['kl']:.4f} > {o.guard_kl_max:g}"
        if "reward_mean" not in row:  # nothing scorable (the reward function failed): no evidence of a drop
            return None
        self.rewards.append(row["reward_mean"])
        if len(self.rewards) > o.guard_window:
            self.rewards.popleft()
        if len(self.rewards) == o.guard_window:
            mean = sum(self.rewards) / o.guard_window
            if self.best_reward_mean is not None and mean < self.best_reward_mean - o.guard_reward_drop:
                return (f"reward drop: mean reward {mean:.3f} over {o.guard_window} steps, best {self.best_reward_mean:.3f}")
            self.best_reward_mean = mean if self.best_reward_mean is None else max(self.best_reward_mean, mean)
        return None

    def target(self, checkpoints: list[Path], alarm_step: int) -> Path | None:
        """The checkpoint to go back to: the newest one older than the weights the alarm was
        measured on — step `alarm_step`'s samples came from the weights saved at `alarm_step - 1`,
        so going back there would raise the same alarm — and, when no newer one was written since
        the last rollback (the alarm came back from there), the one before that. The run's start
        (a step-0 checkpoint) is never at fault: the guard may go back there again, each time with
        a lower learning rate."""
        older = [c for c in checkpoints if checkpoint_step(c) < alarm_step - 1] or checkpoints[:1]
        if self.last_target is not None and older and older[-1] == self.last_target:
            earlier = [c for c in older if c < self.last_target]
            start = checkpoint_step(self.last_target) == 0
            self.last_target = earlier[-1] if earlier else (self.last_target if start else None)
        else:
            self.last_target = older[-1] if older else None
        return self.last_target

    def rolled_back(self) -> float:
        """Count a rollback (an error past the limit); returns the new learning-rate scale."""
        self.rollbacks += 1
        if self.rollbacks > self.options.guard_max_rollbacks:
            raise CollapseGuardStop(f"collapse guard: {self.rollbacks - 1} rollbacks did not help; stopping. "
                                    f"Start again with a lower --lr, or allow more (--guard_max_rollbacks) "
                                    f"or larger cuts (--guard_lr_factor)")
        self.lr_scale *= self.options.guard_lr_factor
        self.rewards.clear()
        return self.lr_scale

    def state(self) -> dict:
        return {"first_entropy": self.first_entropy, "best_reward_mean": self.best_reward_mean,
                "rollbacks": self.rollbacks, "lr_scale": self.lr_scale}

    def load_state(self, state: dict) -> None:
        self.first_entropy = state.get("first_entropy")
        self.best_reward_mean = state.get("best_reward_mean")
        self.rollbacks, self.lr_scale = state.get("rollbacks", 0), state.get("lr_scale", 1.0)


def checkpoint_step(path: Path) -> int:
    return int(Path(path).name.rpartition("_")[2])


def scale_learning_rate(optimizer, scheduler, scale: float) -> None:
    """Multiply the schedule's base rates (and the current ones) by `scale` after a checkpoint
    restored them, so the rest of the schedule runs lower by that factor."""
    scheduler.base_lrs = [lr * scale for lr in scheduler.base_lrs]
    for group in optimizer.param_groups:
        group["lr"] *= scale
