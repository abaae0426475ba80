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
from lmpo.teach.compare.texts import joined, tx


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
              start_label: str = "SFT start", minutes: float = 0.0, lang: str = "en") -> Recommendation:
    """`start_label`: what the runs started from, in words (the SFT start, or --start's model);
    `minutes`: the time budget; `lang`: the language of its lines. A method that trained 0 steps on
    every seed is ranked only when no other method trained."""
    scored = sorted((m for m in methods if m.accuracy.mean is not None), key=lambda m: -m.accuracy.mean)
    scored = [m for m in scored if not m.trained_none] or scored
    if not scored:
        raise ValueError(tx("rec.nothing", lang))
    best, label = scored[0], start_label
    lines = [tx("rec.highest", lang, best=best.method, accuracy=pct(best.accuracy), n=best.accuracy.n, label=label,
                start=pct(start))]
    lines += [_no_steps_line(m, start_label, minutes, lang) for m in methods if m.no_steps_seeds]
    within, beyond, undecided = [best.method], [], []
    for other in scored[1:]:
        gap, spread = best.accuracy.mean - other.accuracy.mean, noise(best.accuracy, other.accuracy)
        if gap == 0:  # level whatever the spread: the listed order must not pick between them
            within.append(other.method)
            lines.append(tx("rec.same", lang, other=other.method, best=best.method))
        elif spread is None:
            undecided.append(other.method)
            lines.append(tx("rec.one_seed", lang, other=other.method, gap=100 * gap))
        else:
            (beyond if gap > spread else within).append(other.method)
            lines.append(tx("rec.beyond" if gap > spread else "rec.within", lang, other=other.method, gap=100 * gap,
                            spread=100 * spread))
    start_spread = noise(best.accuracy, start)
    worse = start.mean is not None and best.accuracy.mean < start.mean
    level_with_start = start.mean is not None and best.accuracy.mean == start.mean
    if start.mean is not None:
        gain = best.accuracy.mean - start.mean
        if worse:
            lines.append(tx("rec.worse", lang, label=label, best=best.method, drop=100 * -gain))
        elif start_spread is not None and gain <= start_spread:
            lines.append(tx("rec.not_beyond_start", lang, label=label, gain=100 * gain))
        elif gain == 0:
            lines.append(tx("rec.level_start", lang, best=best.method, label=label, start=pct(start)))
        else:
            lines.append(tx("rec.gained", lang, best=best.method, label=label, gain=100 * gain))
    tied = [m for m in scored if m.method in within]
    # on the seconds as shown: two methods at "12 s" are equally quick, and the leaner of them goes first
    fastest = min(tied, key=lambda m: (round(m.seconds.mean), m.peak_rss_mb.mean or math.inf))
    as_quick = [m.method for m in tied if m is not fastest and round(m.seconds.mean) == round(fastest.seconds.mean)]
    with_memory = [m for m in tied if m.peak_rss_mb.mean is not None]
    leanest = min(with_memory, key=lambda m: m.peak_rss_mb.mean).method if with_memory else None
    choice = best.method
    spread_known = any(noise(best.accuracy, m.accuracy) is not None for m in tied[1:])
    if len(tied) > 1:
        together = tx("rec.within_best" if spread_known else "rec.level_best", lang)
        lines.append(tx("rec.tied", lang, together=together, names=joined((m.method for m in tied), lang),
                        fastest=(tx("rec.time_tie", lang, names=joined([fastest.method, *as_quick], lang))
                                 if as_quick else fastest.method), seconds=fastest.seconds.mean, leanest=leanest,
                        mb=_mb(tied, leanest)))
        choice, why = ((leanest, tx("rec.why_lean", lang)) if budget == "time" and leanest
                       else (fastest.method, tx("rec.why_quick_tie", lang, others=joined(as_quick, lang)) if as_quick
                             else tx("rec.why_quick", lang)))
        if choice == best.method and spread_known:
            lines.append(tx("rec.best_of_noise", lang, choice=choice, why=why))
        elif choice == best.method:
            others = joined((m.method for m in tied[1:]), lang)
            lines.append(tx("rec.best_of_level", lang, choice=choice, others=others, why=why))
        else:
            key = "rec.other_of_noise" if spread_known else "rec.other_of_level"
            lines.append(tx(key, lang, choice=choice, best=best.method, why=why))
        if undecided:
            lines[-1] += tx("rec.more_seeds", lang, best=best.method, undecided=joined(undecided, lang))
    elif undecided:
        lines.append(tx("rec.undecided", lang, best=best.method, undecided=joined(undecided, lang)))
    elif len(scored) == 1:
        only = "rec.only_trained" if any(m.trained_none for m in methods) else "rec.only_compared"
        lines.append(tx(only, lang, best=best.method))
    else:
        lines.append(tx("rec.ahead", lang, best=best.method))
    if worse:  # the most accurate method still made the model worse: recommending it needs saying so
        lines[-1] += tx("rec.all_worse", lang, label=label)
    elif level_with_start:
        lines[-1] += tx("rec.none_above", lang, label=label)
    return Recommendation(best.method, choice, within, beyond, undecided, fastest.method, leanest, lines)


def _no_steps_line(m: MethodSummary, start_label: str, minutes: float, lang: str = "en") -> str:
    which = (tx("rec.every_seed", lang) if m.trained_none else
             tx("rec.seeds" if len(m.no_steps_seeds) > 1 else "rec.seed", lang, seeds=joined(m.no_steps_seeds, lang)))
    budget = f"--minutes {minutes:g}" if minutes else "--minutes"
    ranked = tx("rec.not_ranked", lang) if m.trained_none else ""
    return tx("rec.no_steps", lang, method=m.method, which=which, budget=budget, label=start_label, ranked=ranked)


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
