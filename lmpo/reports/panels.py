"""Which metrics go into which figure (one PNG per :class:`Panel`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Curve:
    """One line on an axis."""

    key: str
    label: str
    band: str | None = None  # key of a std-dev drawn as a +-band around the line
    sparse: bool = False  # logged every N steps (eval): markers, no smoothing
    smooth: bool = True  # False for curves that are not noisy (lr schedule)


@dataclass(frozen=True)
class Axis:
    """One subplot."""

    title: str
    curves: tuple[Curve, ...]
    ylabel: str = ""
    percent: bool = False  # values are fractions in [0, 1]
    stacked: bool = False  # stack the curves (time per phase)
    total: str | None = None  # key drawn as a line on top of a stack

    def keys(self) -> tuple[str, ...]:
        extra = (self.total,) if self.total else ()
        return tuple(c.key for c in self.curves) + extra


@dataclass(frozen=True)
class Panel:
    """One figure, written as ``<name>.png``."""

    name: str
    title: str
    axes: tuple[Axis, ...]


PHASES = ("generate", "score", "logprobs", "advantages", "update")

PANELS: tuple[Panel, ...] = (
    Panel("loss", "Loss", (
        Axis("Loss", (
            Curve("loss", "train loss"),
            Curve("eval_loss", "eval loss", sparse=True),
        )),
    )),
    Panel("reward", "Reward", (
        Axis("Reward (mean, band = +-std within batch)", (
            Curve("reward_mean", "reward mean", band="reward_std"),
        ), ylabel="reward"),
    )),
    Panel("accuracy", "Accuracy", (
        Axis("Answer accuracy", (
            Curve("accuracy", "train batch"),
            Curve("eval_accuracy", "held-out eval", sparse=True),
        ), percent=True),
        Axis("Format accuracy", (
            Curve("format_accuracy", "train batch"),
            Curve("eval_format_accuracy", "held-out eval", sparse=True),
        ), percent=True),
    )),
    Panel("kl", "KL divergence to reference", (
        Axis("KL", (Curve("kl", "KL"),)),
    )),
    Panel("entropy", "Policy entropy", (
        Axis("Entropy (nats/token)", (Curve("entropy", "entropy"),)),
    )),
    Panel("length", "Completion length", (
        Axis("Completion length", (
            Curve("completion_len_mean", "mean"),
            Curve("completion_len_max", "max"),
        ), ylabel="tokens"),
        Axis("Truncated completions", (
            Curve("truncated_frac", "truncated fraction"),
        ), percent=True),
    )),
    Panel("zero_var", "Groups with zero reward variance (no learning signal)", (
        Axis("Zero-variance groups", (
            Curve("zero_var_frac", "fraction of groups"),
        ), percent=True),
    )),
    Panel("optim", "Optimisation", (
        Axis("PPO clip fraction", (Curve("clip_frac", "clip fraction"),),
             percent=True),
        Axis("Gradient norm", (Curve("grad_norm", "grad norm"),)),
        Axis("Learning rate", (Curve("lr", "lr", smooth=False),)),
    )),
    Panel("throughput", "Throughput", (
        Axis("Tokens per second", (Curve("tokens_per_s", "tokens/s"),)),
    )),
    Panel("phase_time", "Time per step, by phase", (
        Axis(
            "Time per phase",
            tuple(Curve(f"time_{p}", p) for p in PHASES),
            ylabel="seconds",
            stacked=True,
            total="time_step",
        ),
    )),
)

# Order of rows in the HTML table of final values; other keys follow, sorted.
MAIN_KEYS: tuple[str, ...] = (
    "loss", "eval_loss", "reward_mean", "reward_std", "accuracy",
    "eval_accuracy", "format_accuracy", "eval_format_accuracy", "kl",
    "entropy", "completion_len_mean", "completion_len_max", "truncated_frac",
    "zero_var_frac", "clip_frac", "grad_norm", "lr", "tokens_per_s",
    "time_step",
)
