"""What a fact-check is: a claim, a measurement, and a verdict judged from the measurement.

A `Claim` keeps the measuring and the judging apart: `measure(ctx)` runs the experiment or
the computation and returns numbers (`Measured`); `judge(values, limits)` turns those numbers
into a `Verdict` by the criterion the claim states, with the thresholds in `limits`. Nothing
in a verdict is typed by hand: if the numbers come out the other way, the verdict changes.
"""

from __future__ import annotations

import math
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from lmpo.teach.factcheck.context import Context

HOLDS = "holds"
FAILS = "does not hold"
DEPENDS = "depends"
ERROR = "error"
VERDICTS = (HOLDS, FAILS, DEPENDS)


@dataclass
class Measured:
    """What an experiment measured: named numbers (or short strings), and optionally a plot."""

    values: dict[str, Any]
    plot: bytes | None = None
    """A PNG image of the evidence."""


@dataclass(frozen=True)
class Verdict:
    verdict: str
    """holds, does not hold, or depends."""
    note: str
    """Key of the claim's note template that says why (or on what it depends)."""


@dataclass(frozen=True)
class Claim:
    """One claim the field repeats, and how lmpo checks it. The texts are English templates;
    the Chinese ones are in `zh.py` under the same name and keys."""

    name: str
    """Short identifier, used by `--only`."""
    fast: bool
    """An exact computation (seconds); False for claims that train models."""
    papers: tuple[str, ...]
    """Where the claim comes from, each with its arXiv id."""
    text: str
    """The claim as people say it."""
    criterion: str
    """How the verdict follows from the numbers; formatted with `limits`."""
    summary: str
    """The key numbers in one line; formatted with the measured values."""
    notes: dict[str, str]
    """Why the verdict is what it is (or on what it depends), by key; formatted with the values."""
    limits: dict[str, float]
    """The thresholds of the criterion."""
    measure: Callable[["Context"], Measured]
    judge: Callable[[dict[str, Any], dict[str, float]], Verdict]


@dataclass
class Outcome:
    """A claim after it ran: its verdict, evidence and wall time (or the error that stopped it)."""

    claim: Claim
    seconds: float
    verdict: str = ERROR
    note: str = ""
    values: dict[str, Any] = field(default_factory=dict)
    plot: bytes | None = None
    error: str = ""


def check(claim: Claim, ctx: "Context") -> Outcome:
    """Measure, then judge; an exception becomes an `error` outcome that names it (the other
    claims still run)."""
    started = time.perf_counter()
    try:
        measured = claim.measure(ctx)
        verdict = claim.judge(measured.values, claim.limits)
    except Exception as err:  # noqa: BLE001 - one failing experiment must not hide the others
        ctx.log_error(claim.name, traceback.format_exc())
        return Outcome(claim, time.perf_counter() - started, error=f"{type(err).__name__}: {err}")
    if verdict.verdict not in VERDICTS or verdict.note not in claim.notes:
        raise ValueError(f"claim {claim.name}: judge returned {verdict}, not one of {VERDICTS} with a known note")
    return Outcome(claim, time.perf_counter() - started, verdict.verdict, verdict.note, measured.values, measured.plot)


def fill(template: str, values: dict[str, Any]) -> str:
    """`template` formatted with `values`; a missing value shows as `?` rather than failing."""
    return template.format_map(_Lenient(values))


class _Lenient(dict):
    def __missing__(self, key: str) -> "_Missing":
        return _Missing()


class _Missing:
    def __format__(self, spec: str) -> str:
        return "?"


def finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
