"""The comparison's table and its recommendation, computed from the runs' records.

The recommendation is a set of rules over the table, never fixed text:
- the best method has the highest mean held-out accuracy over seeds;
- another method's gap to it is larger than noise when it exceeds the seeds' spread,
  sqrt(std_best² + std_other²) (sample standard deviations over seeds); with one seed there is
  no spread to compare with, so no gap is called larger than noise and none is called within it;
- a method with exactly the best's accuracy is level with it, with or without a spread;
- among the methods within noise of the best (or level with it), the cheapest is recommended: the
  least wall time under a sample budget, the least peak memory under a time budget (where wall
  times are matched); when no other method is, the best is;
- a recommendation whose method did not end above the start says so.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from lmpo.teach.compare.records import RunRecord


@dataclass
class Spread:
    mean: float | None
    std: float | None
    n: int

    @classmethod
    def of(cls, values: list[float | None]) -> "Spread":
        xs = [float(v) for v in values if v is not None]
        if not xs:
            return cls(None, None, 0)
        return cls(statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else None, len(xs))


@dataclass
class MethodSummary:
    method: str
    accuracy: Spread
    seconds: Spread
    peak_rss_mb: Spread
    samples: Spread
    completion_tokens: Spread
    models_held: list[str]
    reference: str
    budget_unit: str
    """What the budget became for this method, e.g. `250 steps x 64 samples`."""
    what_counts: str
    seeds: list[int] = field(default_factory=list)
    no_steps_seeds: list[int] = field(default_factory=list)
    """Seeds whose run trained 0 steps within the time budget (its reference pass outlasted it)."""

    @property
    def trained_none(self) -> bool:
        return bool(self.seeds) and len(self.no_steps_seeds) == len(self.seeds)


def summarise(method: str, records: list[RunRecord], models_held: list[str], reference: str, budget_unit: str,
              what_counts: str) -> MethodSummary:
    return MethodSummary(method, Spread.of([r.accuracy for r in records]), Spread.of([r.seconds for r in records]),
                         Spread.of([r.peak_rss_mb for r in records]), Spread.of([r.samples for r in records]),
                         Spread.of([r.completion_tokens for r in records]), models_held, reference, budget_unit,
                         what_counts, [r.seed for r in records], [r.seed for r in records if r.no_steps])


@dataclass
class Recommendation:
    best: str
    choice: str
    within_noise: list[str]
    """Methods whose mean accuracy is within the seeds' spread of the best's (the best included)."""
    beyond_noise: list[str]
    """Methods whose gap to the best exceeds the seeds' spread."""
    undecided: list[str]
    """Methods whose gap cannot be judged: one seed, so no spread."""
    cheapest_time: str
    cheapest_memory: str | None
    lines: list[str]


def noise(a: Spread, b: Spread) -> float | None:
    if a.std is None or b.std is None:
        return None
    return math.sqrt(a.std ** 2 + b.std ** 2)


def recommend(methods: list[MethodSummary], start: Spread, budget: str = "samples",
              start_label: str = "SFT start", minutes: float = 0.0) -> Recommendation:
    """`start_label`: what the runs started from, in words (the SFT start, or --start's model);
    `minutes`: the time budget. A method that trained 0 steps on every seed is ranked only when no
    other method trained."""
    scored = sorted((m for m in methods if m.accuracy.mean is not None), key=lambda m: -m.accuracy.mean)
    scored = [m for m in scored if not m.trained_none] or scored
    if not scored:
        raise ValueError("compare: no run has a held-out accuracy (eval_problems=0?); nothing to recommend")
    best = scored[0]
    lines = [f"Highest mean held-out accuracy: {best.method}, {pct(best.accuracy)} over {best.accuracy.n} "
             f"seed(s) ({start_label}: {pct(start)})."]
    lines += [_no_steps_line(m, start_label, minutes) for m in methods if m.no_steps_seeds]
    within, beyond, undecided = [best.method], [], []
    for other in scored[1:]:
        gap, spread = best.accuracy.mean - other.accuracy.mean, noise(best.accuracy, other.accuracy)
        if gap == 0:  # level whatever the spread: the listed order must not pick between them
            within.append(other.method)
            lines.append(f"{other.method}: the same accuracy as {best.method}.")
        elif spread is None:
            undecided.append(other.method)
            lines.append(f"{other.method}: {100 * gap:.1f} points below; one seed, so no spread to judge it by.")
        elif gap > spread:
            beyond.append(other.method)
            lines.append(f"{other.method}: {100 * gap:.1f} points below, more than the seeds' spread "
                         f"({100 * spread:.1f} points).")
        else:
            within.append(other.method)
            lines.append(f"{other.method}: {100 * gap:.1f} points below, within the seeds' spread "
                         f"({100 * spread:.1f} points).")
    start_spread = noise(best.accuracy, start)
    worse = start.mean is not None and best.accuracy.mean < start.mean
    level_with_start = start.mean is not None and best.accuracy.mean == start.mean
    if start.mean is not None:
        gain = best.accuracy.mean - start.mean
        if worse:
            lines.append(f"No method improved on the {start_label}: the best, {best.method}, ended "
                         f"{100 * -gain:.1f} points below it.")
        elif start_spread is not None and gain <= start_spread:
            lines.append(f"No method beat the {start_label} by more than the seeds' spread ({100 * gain:+.1f} points).")
        elif gain == 0:
            lines.append(f"{best.method} ended where the {start_label} was ({pct(start)}).")
        else:
            lines.append(f"{best.method} gained {100 * gain:+.1f} points over the {start_label}.")
    tied = [m for m in scored if m.method in within]
    fastest = min(tied, key=lambda m: (m.seconds.mean, m.peak_rss_mb.mean or math.inf))
    with_memory = [m for m in tied if m.peak_rss_mb.mean is not None]
    leanest = min(with_memory, key=lambda m: m.peak_rss_mb.mean).method if with_memory else None
    choice = best.method
    spread_known = any(noise(best.accuracy, m.accuracy) is not None for m in tied[1:])
    if len(tied) > 1:
        together = "Within noise of the best" if spread_known else "Level with the best (the same accuracy)"
        lines.append(f"{together}: {', '.join(m.method for m in tied)}; least wall time: "
                     f"{fastest.method} ({fastest.seconds.mean:.0f} s), least peak memory: {leanest} "
                     f"({_mb(tied, leanest)}).")
        choice, why = ((leanest, "the leanest in memory") if budget == "time" and leanest
                       else (fastest.method, "the quickest"))
        if choice == best.method and spread_known:
            lines.append(f"Recommendation: {choice} — the most accurate, and {why} of the methods within noise of it.")
        elif choice == best.method:
            others = ", ".join(m.method for m in tied[1:])
            lines.append(f"Recommendation: {choice} — as accurate as {others} here, and {why} of them.")
        else:
            how = "within noise" if spread_known else "here"
            lines.append(f"Recommendation: {choice} — as accurate as {best.method} {how}, and {why} of those.")
        if undecided:
            lines[-1] += (f" Rerun with more --seeds to tell whether {best.method}'s lead over {', '.join(undecided)} "
                          f"is more than noise.")
    elif undecided:
        lines.append(f"Recommendation: {best.method} on these numbers; rerun with more --seeds to tell whether its "
                     f"lead over {', '.join(undecided)} is more than noise.")
    elif len(scored) == 1:
        only = "that trained within the budget" if any(m.trained_none for m in methods) else "compared"
        lines.append(f"Recommendation: {best.method} — the only method {only}, so none to rank it against.")
    else:
        lines.append(f"Recommendation: {best.method} — ahead of every other method by more than the seeds' spread.")
    if worse:  # the most accurate method still made the model worse: recommending it needs saying so
        lines[-1] += (f" But every method ended below the {start_label} at this budget: none is worth training "
                      f"with as it stands.")
    elif level_with_start:
        lines[-1] += (f" But no method ended above the {start_label} at this budget: none has shown it is worth "
                      f"training with as it stands.")
    return Recommendation(best.method, choice, within, beyond, undecided, fastest.method, leanest, lines)


def _no_steps_line(m: MethodSummary, start_label: str, minutes: float) -> str:
    which = ("every seed" if m.trained_none else
             f"seed{'s' if len(m.no_steps_seeds) > 1 else ''} {', '.join(map(str, m.no_steps_seeds))}")
    budget = f"--minutes {minutes:g}" if minutes else "--minutes"
    ranked = " and is not ranked" if m.trained_none else ""
    return (f"{m.method}: trained 0 steps on {which}: its reference log-prob pass alone took longer than {budget}, "
            f"so its accuracy there is the {start_label}'s{ranked}. Raise --minutes (or lower --samples, which "
            f"sets how many pairs that pass scores) to compare it.")


def _mb(methods: list[MethodSummary], name: str | None) -> str:
    found = next((m.peak_rss_mb.mean for m in methods if m.method == name), None)
    return "n/a" if found is None else f"{found:.0f} MB"


def pct(spread: Spread) -> str:
    """`62.3% ± 1.2` (mean ± std over seeds, in points), `62.3%` for one seed, `n/a` for none."""
    if spread.mean is None:
        return "n/a"
    if spread.std is None:
        return f"{100 * spread.mean:.1f}%"
    return f"{100 * spread.mean:.1f}% ± {100 * spread.std:.1f}"
