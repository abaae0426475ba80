"""Which metrics go into which figure (one PNG per :class:`Panel`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace


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
            Curve("ptx_loss", "ptx loss (PPO-ptx data NLL)"),
        )),
    )),
    Panel("reward", "Reward", (
        Axis("Reward (mean; band: +-std within the batch, where logged)", (
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
    # Preference runs (DPO and its kin, online DPO, KTO, reward models): absent keys draw no figure.
    Panel("preference", "Preference pairs", (
        Axis("Implicit rewards (beta x log-ratio to the reference)", (
            Curve("chosen_reward", "chosen"),
            Curve("rejected_reward", "rejected"),
            Curve("desirable_reward", "desirable"),
            Curve("undesirable_reward", "undesirable"),
        ), ylabel="reward"),
        Axis("Reward margin (chosen - rejected; KTO: desirable - undesirable)", (Curve("margin", "margin"),),
             ylabel="reward"),
        Axis("Sequence log-probabilities", (
            Curve("chosen_logps", "chosen"),
            Curve("rejected_logps", "rejected"),
        ), ylabel="log-prob"),
    )),
    # Rejection-sampling fine-tuning (lmpo train rft): one point per round.
    Panel("rft", "Rejection sampling per round", (
        Axis("Accepted samples and solved prompts", (
            Curve("acceptance_rate", "samples accepted", sparse=True),
            Curve("solved_rate", "prompts with an accepted sample", sparse=True),
        ), percent=True),
        Axis("Kept samples and hard prompts", (
            Curve("kept", "kept samples", sparse=True),
            Curve("hard_prompts", "hard prompts", sparse=True),
        ), ylabel="count"),
    )),
    Panel("kl", "KL to reference (per-token estimate; k1 can dip below 0)", (
        Axis("KL", (Curve("kl", "KL"),), ylabel="nats/token"),
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
    # Agent (multi-turn, tool-using) runs only: absent keys draw no figure.
    Panel("agent", "Agent episodes", (
        Axis("Turns and tool calls per episode (mean)", (
            Curve("turns_mean", "turns"),
            Curve("tool_calls_mean", "tool calls"),
            Curve("eval_turns_mean", "eval turns", sparse=True),
        ), ylabel="per episode"),
        Axis("Parse errors per episode (mean)", (
            Curve("parse_errors_mean", "parse errors"),
        ), ylabel="per episode"),
        Axis("Held-out episodes with a tool call", (
            Curve("eval_tool_call_rate", "held-out eval", sparse=True),
        ), percent=True),
    )),
    Panel("obs_tokens", "Observation tokens", (
        Axis("Share of tokens after the prompt from the environment or template", (
            Curve("obs_token_frac", "observation fraction"),
        ), percent=True),
    )),
    Panel("zero_var", "Groups with zero reward variance (no group-relative learning signal)", (
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
    # PPO with a critic (advantage=gae, critic=head or separate).
    Panel("critic", "Critic (value model)", (
        Axis("Value loss", (Curve("value_loss", "value loss"),)),
        Axis("Mean value over completion tokens", (Curve("value_mean", "value mean"),), ylabel="value"),
        Axis("Value clip fraction", (Curve("value_clip_frac", "clipped value share"),), percent=True),
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

# Where a run logs a reward margin, its `accuracy` is the share of preference pairs whose chosen
# answer scores above the rejected one, not answer accuracy: it gets its own axis and name.
PAIR_MARKER = "margin"
PAIR_ACCURACY = Panel("accuracy", "Accuracy", (
    Axis("Pair accuracy (chosen scored above rejected)", (Curve("accuracy", "train pairs"),), percent=True),
    Axis("Answer accuracy", (Curve("eval_accuracy", "held-out eval", sparse=True),), percent=True),
    Axis("Format accuracy", (Curve("eval_format_accuracy", "held-out eval", sparse=True),), percent=True),
))

# A reward model's run (`lmpo train rm`, run.json's trainer "rm"; a pipeline's rm stage) logs both
# `accuracy` and `eval_accuracy` as pairwise accuracy, on training pairs and held-out pairs: it
# answers no problems, so nothing of it is answer accuracy.
REWARD_MODEL_TRAINER = "rm"
REWARD_MODEL_ACCURACY = Panel("accuracy", "Pairwise accuracy (reward model)", (
    Axis("Pairwise accuracy (chosen scored above rejected)", (
        Curve("accuracy", "train pairs"),
        Curve("eval_accuracy", "held-out pairs", sparse=True),
    ), percent=True),
))
REWARD_MODEL_KEYS = {"accuracy": "accuracy (pairwise, train pairs)",
                     "eval_accuracy": "eval_accuracy (pairwise, held-out pairs)"}
"""How the HTML table of final values names a reward model's accuracies."""

# Order of rows in the HTML table of final values; other keys follow, sorted.
MAIN_KEYS: tuple[str, ...] = (
    "loss", "eval_loss", "reward_mean", "reward_std", "accuracy",
    "eval_accuracy", "format_accuracy", "eval_format_accuracy", "kl",
    "entropy", "completion_len_mean", "completion_len_max", "truncated_frac",
    "zero_var_frac", "turns_mean", "tool_calls_mean", "parse_errors_mean",
    "obs_token_frac", "eval_turns_mean", "eval_tool_call_rate", "clip_frac",
    "grad_norm", "lr", "tokens_per_s", "time_step",
)

# Why an agent episode ended; logged as ``termination_<reason>`` (train batch)
# and ``eval_termination_<reason>`` (held-out), each the fraction of episodes.
TERMINATION_REASONS: tuple[str, ...] = (
    "answered", "env_done", "max_turns", "token_budget", "turn_length",
    "context_overflow", "parse_error_limit", "tool_timeout", "env_error",
)
TERMINATION_PREFIX = "termination_"
EVAL_TERMINATION_PREFIX = "eval_termination_"


def _reasons(keys: Iterable[str], prefix: str) -> list[str]:
    """Reasons logged under ``prefix``: the known ones in order, then others sorted."""
    found = {k[len(prefix):] for k in keys if k.startswith(prefix) and len(k) > len(prefix)}
    known = [r for r in TERMINATION_REASONS if r in found]
    return known + sorted(found - set(known))


def termination_panel(keys: Iterable[str]) -> Panel | None:
    """Episode end reasons over steps (stacked for the train batch, lines for eval).

    Built from whichever ``termination_<reason>`` keys were logged, so new
    reasons show up without a code change; None when there are none.
    """
    keys = list(keys)
    train = _reasons(keys, TERMINATION_PREFIX)
    held_out = _reasons(keys, EVAL_TERMINATION_PREFIX)
    axes = []
    if train:
        axes.append(Axis(
            "Train episodes by end reason",
            tuple(Curve(TERMINATION_PREFIX + r, r) for r in train),
            percent=True, stacked=True,
        ))
    if held_out:
        axes.append(Axis(
            "Held-out episodes by end reason",
            tuple(Curve(EVAL_TERMINATION_PREFIX + r, r, sparse=True) for r in held_out),
            percent=True,
        ))
    return Panel("termination", "How episodes ended", tuple(axes)) if axes else None


# `kl` is the mean of the run's own estimator (run.json's kl_estimator), not the divergence itself:
# k1 (the log-ratio; PPO's reward penalty) is negative on a batch the reference finds likelier.
KL_TITLES = {"k1": "KL to reference (k1 estimate per token; can dip below 0)",
             "k2": "KL to reference (k2 estimate per token; never below 0)",
             "k3": "KL to reference (k3 estimate per token; never below 0)",
             "k3_ratio": "KL to reference (k3_ratio estimate per token; never below 0)",
             "kto": "KTO reference point z0 (batch KL estimate, clamped at 0)"}


def panels_for(keys: Iterable[str], trainer: str | None = None, kl_estimator: str | None = None) -> list[Panel]:
    """:data:`PANELS` (with :data:`PAIR_ACCURACY` for a run of preference pairs, and
    :data:`REWARD_MODEL_ACCURACY` for a reward model's run, `trainer` "rm") plus, when
    termination keys exist, the termination panel (placed after the observation-token panel).
    The KL panel's title names the estimator behind `kl` where the run's options say it."""
    keys = set(keys)
    accuracy = (REWARD_MODEL_ACCURACY if trainer == REWARD_MODEL_TRAINER else
                PAIR_ACCURACY if PAIR_MARKER in keys else None)
    panels = [accuracy if p.name == "accuracy" and accuracy is not None else p for p in PANELS]
    kl_title = KL_TITLES.get("kto" if trainer == "kto" else kl_estimator or "")
    if kl_title:
        panels = [replace(p, title=kl_title) if p.name == "kl" else p for p in panels]
    extra = termination_panel(keys)
    if extra is None:
        return panels
    out: list[Panel] = []
    for panel in panels:
        out.append(panel)
        if panel.name == "obs_tokens":
            out.append(extra)
    return out
