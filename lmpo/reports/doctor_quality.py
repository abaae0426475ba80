"""Doctor checks that read figures every policy trainer logs, RL or preference: answers that stop
ending well (check_eos), and pairs ranked worse than chance (check_below_chance)."""

from __future__ import annotations

import math

from .doctor_base import Finding, Thresholds, ends, finite_values, mean, pct, plural
from .metrics import Row, as_float


def _completions(row: Row, group_size: int | None) -> float | None:
    """How many completions a training row's figures count, where the row and the run say it."""
    groups = as_float(row.get("groups_sampled"))
    return groups * group_size if groups and group_size else None


def _beyond_noise(f0: float, n0: float, f1: float, n1: float, th: Thresholds) -> bool:
    """A fall of two shares larger than `th.eos_noise` standard errors of their difference."""
    p = (f0 * n0 + f1 * n1) / (n0 + n1)
    return f0 - f1 >= th.eos_noise * math.sqrt(p * (1 - p) * (1 / n0 + 1 / n1))


def _training_fall(rows: list[Row], th: Thresholds, group_size: int | None) -> tuple[float, float] | None:
    """(start, end) window means of the training format accuracy when it fell by more than noise:
    the first and last tenth, each weighed by the completions behind it, or, where those are not
    known, windows of at least `th.eos_min_steps` steps."""
    points = [(v, _completions(r, group_size)) for r in rows
              if (v := as_float(r.get("format_accuracy"))) is not None and math.isfinite(v)]
    counts = [n for _, n in points]
    values = [v for v, _ in points]
    k = max(1, len(points) // 10) if None not in counts else max(th.eos_min_steps, len(points) // 10)
    if len(points) < 2 * k:
        return None
    f0, f1 = mean(values[:k]), mean(values[-k:])
    if f0 - f1 < th.eos_drop:
        return None
    if None not in counts and not _beyond_noise(f0, sum(counts[:k]), f1, sum(counts[-k:]), th):
        return None
    return f0, f1


def _heldout_fall(rows: list[Row], th: Thresholds) -> tuple[float, float] | None:
    fmt = finite_values(rows, "eval_format_accuracy")
    if len(fmt) < 2:
        return None
    f0, f1 = ends(fmt) if len(fmt) >= 4 else (fmt[0], fmt[-1])
    return (f0, f1) if f0 - f1 >= th.eos_drop else None


def check_eos(rows: list[Row], th: Thresholds, group_size: int | None = None) -> list[Finding]:
    """Completions that stop ending with EOS in the answer format, in training or held out."""
    for key, where, fall in (("format_accuracy", "training", _training_fall(rows, th, group_size)),
                             ("eval_format_accuracy", "held-out", _heldout_fall(rows, th))):
        if fall is not None:
            f0, f1 = fall
            return [Finding("eos_loss", "warning", key, f"{pct(f0)} → {pct(f1)}", f"a fall of >= {pct(th.eos_drop)}",
                            f"fewer {where} completions end with EOS in the answer format",
                            "add --missing_eos_penalty, raise --beta, lower --lr; if a reward model "
                            "scores, it likely rewards unterminated text")]
    return []


def check_below_chance(rows: list[Row], th: Thresholds, trainer: str) -> list[Finding]:
    """A pairwise ranker (a reward model, or DPO's and ORPO's implicit reward) that ends up
    preferring the rejected side: the labels are read the wrong way round, or training broke it.
    A reward model's held-out pairs where it evaluated them; otherwise the training pairs, over the
    last tenth of the logged rows (at least 3: one batch is few pairs)."""
    held = finite_values(rows, "eval_accuracy") if trainer == "rm" else []
    train = finite_values(rows, "accuracy")
    if held:
        end, where, metric = held[-1], "held-out pairs (the last evaluation)", "eval_accuracy"
    elif trainer in ("rm", "dpo", "orpo") and len(train) >= 3:
        k = max(3, len(train) // 10)
        end, where, metric = mean(train[-k:]), f"training pairs (the last {plural(k, 'logged step')})", "accuracy"
    else:
        return []
    if end > th.pair_chance:
        return []
    return [Finding("below_chance", "note", metric, pct(end), f"<= {pct(th.pair_chance)} (chance: 50.0%)",
                    f"on {where} the model ranks the rejected completion above the chosen one more often than "
                    "a coin would",
                    "check that the data's chosen and rejected sides are not swapped (--chosen_field, "
                    "--rejected_field); lower --lr")]
