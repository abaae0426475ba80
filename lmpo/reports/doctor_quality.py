"""Doctor checks that read figures every policy trainer logs, RL or preference: answers that stop
ending well (check_eos), and pairs ranked worse than chance (check_below_chance)."""

from __future__ import annotations

import math

from .doctor_base import Finding, Thresholds, finite_points, finite_values, mean, pct, plural
from .metrics import Row, as_float


def _completions(row: Row, group_size: int | None) -> float | None:
    """How many completions a training row's figures count, where the row and the run say it."""
    groups = as_float(row.get("groups_sampled"))
    return groups * group_size if groups and group_size else None


def beyond_noise(f0: float, n0: float, f1: float, n1: float, th: Thresholds) -> bool:
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
    if None not in counts and not beyond_noise(f0, sum(counts[:k]), f1, sum(counts[-k:]), th):
        return None
    return f0, f1


def eval_count(shares: list[float], configured: int | None) -> int | None:
    """How many problems each held-out evaluation graded: the run's --eval_problems when every
    logged share is a whole number of them, else (fewer problems than asked for, as from a short
    --eval_prompts file) the smallest count every share is a whole number of, a lower bound.
    None when the run does not say (rows without a run.json)."""
    def fits(n: int) -> bool:
        return all(abs(v * n - round(v * n)) < 1e-6 for v in shares)

    if not configured or configured < 1:
        return None
    return configured if fits(configured) else next((n for n in range(1, configured) if fits(n)), None)


def counted(share: float, n: int | None, evals: int = 1) -> str:
    """A held-out share with the problems behind it: "12.5% (1/8)"; of a window of evaluations,
    their total ("6.2% (1/16 over 2 evaluations)")."""
    if n is None:
        return pct(share)
    total = n * evals
    over = f" over {evals} evaluations" if evals > 1 else ""
    return f"{pct(share)} ({round(share * total)}/{total}{over})"


def _heldout_fall(rows: list[Row], th: Thresholds, eval_n: int | None) -> tuple[str, str] | None:
    """(value, what it rests on) of a fall of held-out format accuracy from the first evaluations
    to the last, beyond `th.eos_noise` standard errors where the problems behind each are known."""
    fmt = finite_values(rows, "eval_format_accuracy")
    if len(fmt) < 2:
        return None
    k = max(1, len(fmt) // 10) if len(fmt) >= 4 else 1
    f0, f1 = mean(fmt[:k]), mean(fmt[-k:])
    n = eval_count(fmt, eval_n)
    if f0 - f1 < th.eos_drop or (n is not None and not beyond_noise(f0, k * n, f1, k * n, th)):
        return None
    return f"{counted(f0, n, k)} → {counted(f1, n, k)}", f" and {noise_bar(th)}" if n is not None else ""


def noise_bar(th: Thresholds) -> str:
    return f">= {th.eos_noise:g} standard errors of sampling noise"


def format_low(rows: list[Row], th: Thresholds, eval_n: int | None = None) -> tuple[str, str] | None:
    """(value, threshold) of the last held-out format accuracy, with its count, where it is below
    `th.sft_format` by `th.eos_noise` standard errors of sampling noise (7/8 is no evidence of < 90%)."""
    fmt = finite_values(rows, "eval_format_accuracy")
    if not fmt or fmt[-1] >= th.sft_format:
        return None
    n = eval_count(fmt, eval_n)
    noise = th.eos_noise * math.sqrt(th.sft_format * (1 - th.sft_format) / n) if n else 0.0
    if th.sft_format - fmt[-1] < noise:
        return None
    return counted(fmt[-1], n), f"< {pct(th.sft_format)}" + (f" by {noise_bar(th)}" if n else "")


def check_eos(rows: list[Row], th: Thresholds, group_size: int | None = None,
              eval_n: int | None = None) -> list[Finding]:
    """Completions that stop ending with EOS in the answer format, in training or held out
    (`eval_n`: the run's --eval_problems, the problems behind each held-out share)."""
    train = _training_fall(rows, th, group_size)
    found = (("format_accuracy", "training", (f"{pct(train[0])} → {pct(train[1])}", "")) if train else
             ("eval_format_accuracy", "held-out", _heldout_fall(rows, th, eval_n)))
    key, where, fall = found
    if fall is None:
        return []
    value, noise = fall
    return [Finding("eos_loss", "warning", key, value, f"a fall of >= {pct(th.eos_drop)}{noise}",
                    f"fewer {where} completions end with EOS in the answer format",
                    "add --missing_eos_penalty, raise --beta, lower --lr; if a reward model "
                    "scores, it likely rewards unterminated text")]


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


def check_heldout_fall(rows: list[Row], th: Thresholds, eval_n: int | None = None) -> list[Finding]:
    """A run evaluated before training (step 0) and once after it (SFT, DPO, KTO, ORPO, a reward
    model), whose held-out accuracy ended below its start by `th.heldout_drop` and, where
    `eval_n` says the problems (or pairs) behind each share, by `th.eos_noise` standard errors.
    A run with more evaluations is check_decline's."""
    evals = finite_points(rows, "eval_accuracy")
    if len(evals) != 2 or evals[0][0] != 0:
        return []
    (_, f0), (step, f1) = evals
    n = eval_count([f0, f1], eval_n)
    if f0 - f1 < th.heldout_drop or (n is not None and not beyond_noise(f0, n, f1, n, th)):
        return []
    return [Finding("heldout_fell", "warning", "eval_accuracy", f"{counted(f0, n)} (step 0) → {counted(f1, n)} "
                    f"(step {step})", f"a fall of >= {pct(th.heldout_drop)}" + (f" and {noise_bar(th)}" if n else ""),
                    "held-out accuracy ended below that of the model training started from: the run made it worse "
                    "at what it is evaluated on",
                    "lower --lr or train fewer --epochs; check that the training data's answers take the form "
                    "the task grades")]
