"""The doctor's vocabulary: a finding, the thresholds checks cross, and reading series from
metrics rows (finite values only: `lmpo.reports.doctor_faults.check_nonfinite` looks at the others)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .metrics import Row, as_float


@dataclass(frozen=True)
class Finding:
    """One diagnosis. `severity`: "warning" (training is limited or going wrong) or "note"."""

    code: str
    severity: str
    metric: str
    value: str
    threshold: str
    message: str
    remedy: str

    def text(self) -> str:
        return (f"{self.severity}: {self.code}: {self.message} [{self.metric} = {self.value}; "
                f"threshold {self.threshold}] → {self.remedy}")


@dataclass(frozen=True)
class Thresholds:
    """Where each check fires; every finding quotes the one it crossed."""

    zero_var_frac: float = 0.9
    """Mean share of groups whose rewards are all equal (no gradient)."""
    sparse_accuracy: float = 0.05
    """Sampled training accuracy at the start below which the reward is too sparse."""
    easy_accuracy: float = 0.95
    """Sampled training accuracy at the start above which the task is too easy."""
    flat_start: float = 0.5
    """...when at least this share of the first steps' groups also had all-equal rewards (below it,
    partial credit makes the rewards differ within groups whatever the accuracy)."""
    entropy_ratio: float = 0.25
    """Final entropy over starting entropy below which entropy collapsed..."""
    entropy_floor: float = 0.05
    """...when the final entropy (nats/token) is also below this."""
    kl: float = 1.0
    """Mean KL to the reference over the last tenth of the run (nats/token)."""
    truncated_frac: float = 0.2
    """Share of completions cut at max_new_tokens over the last tenth."""
    length_growth: float = 2.0
    """Final over starting mean completion length."""
    reward_rise: float = 0.1
    """A rise of the training reward ..."""
    heldout_drop: float = 0.05
    """... while held-out accuracy falls by this much: reward hacking."""
    eos_drop: float = 0.1
    """A fall of format accuracy (terminated, well-formed answers), train or held-out, ..."""
    eos_noise: float = 2.0
    """... that is also this many standard errors of sampling noise, where the completions behind each
    training step are known (groups_sampled × group_size), ..."""
    eos_min_steps: int = 3
    """... or else each compared window holds at least this many training steps (one step's 8
    completions, 12.5% → 0.0%, is one completion)."""
    pair_chance: float = 0.45
    """Pairwise accuracy (a reward model's held-out pairs; DPO's and ORPO's training pairs) at the
    end at or below which the model ranks the rejected side first more often than chance."""
    kind_drop: float = 0.2
    """A fall of one kind's held-out accuracy (tasks whose problems have kinds: `eval_kind_*`)."""
    kind_gone: float = 0.05
    """A kind solved at least this often by the start model and never by the end model is lost too,
    however small the fall (after-sales seed 1: refunds 7.9% → 0%, every refund refused)."""
    sampler_kl: float = 1e-3
    """KL (k3, nats/token) of the built-in engine's log-probs against the trainer's forward on the
    same weights above which the sampler drew from another distribution (float error is 0 in fp32
    and 1e-6 to 1e-5 under bf16 autocast)."""
    clip_frac: float = 0.2
    """Clip fraction above which ..."""
    clip_share: float = 0.5
    """... in this share of steps is persistently high."""
    loss_still_falling: float = 0.05
    """Relative fall of a supervised loss over the last fifth of the schedule."""
    loss_rise: float = 0.1
    """Relative rise of a supervised loss, its last fifth's mean over its first fifth's: training
    made the model worse on its own data (a learning rate that diverged)."""
    decline: float = 0.15
    """A fall of accuracy (held-out, or training without held-out evaluations) from its best
    window to the last one, ..."""
    decline_ratio: float = 0.3
    """... that is also this share of the best ...
    (a run that only returns to where it started, after a lucky evaluation, is noise)."""
    collapse_ratio: float = 0.25
    """Sampled accuracy at the last steps over that of the first step (the starting model, when
    that was >= `decline`) at or below which a run without signal had collapsed."""
    sft_format: float = 0.9
    """Held-out format accuracy after SFT below which RL would mostly learn to stop."""
    env_error_share: float = 0.25
    """Share of an agent run's episodes that ended in env_error (its environment raised) at or above
    which the environment, not the reward, is what limits training: the reward-signal checks are
    set aside for it."""
    grad_growth: float = 1000.0
    """The gradient norm (before clipping) over the last tenth, against the first tenth's, at or
    above which it exploded (a healthy run's norm moves within a factor of 10 or so)."""


def finite_points(rows: list[Row], key: str) -> list[tuple[object, float]]:
    """(step, value) of each row with a finite `key`."""
    return [(row.get("step"), v) for row in rows if (v := as_float(row.get(key))) is not None and math.isfinite(v)]


def finite_values(rows: list[Row], key: str) -> list[float]:
    return [v for _, v in finite_points(rows, key)]


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def ends(xs: list[float], share: float = 0.1) -> tuple[float, float]:
    """Means of the first and the last `share` of a series (at least one point each)."""
    k = max(1, int(len(xs) * share))
    return mean(xs[:k]), mean(xs[-k:])


def rl_rows(rows: list[Row]) -> list[Row]:
    return [r for r in rows if "reward_mean" in r]


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"
