"""Explainers built from known wrong variants: the symptom is named when the user's output equals a
variant's (computed, where possible, by the library itself with another option)."""

from __future__ import annotations

from typing import Any, Callable

from lmpo.teach.exercise.core import Case, Explainer, is_close

Variant = tuple[Callable[[Case], Any], Callable[[Case, Any, Any], str]]
"""(the wrong variant's output on a case, the symptom given (case, expected, got))."""


def by_variants(*variants: Variant, fallback: Explainer | None = None, rtol: float = 1e-4,
                atol: float = 1e-5) -> Explainer:
    """An explainer that names the first variant the user's output matches, else asks `fallback`."""

    def explain(case: Case, expected: Any, got: Any) -> str | None:
        for variant, message in variants:
            try:
                candidate = variant(case)
            except Exception:  # a variant undefined on this input (e.g. a division by 0)
                continue
            if is_close(candidate, got, rtol, atol) and not is_close(candidate, expected, rtol, atol):
                return message(case, expected, got)
        return fallback(case, expected, got) if fallback else None

    return explain


def fixed(text: str) -> Callable[[Case, Any, Any], str]:
    return lambda case, expected, got: text


def always(text: str) -> Explainer:
    """An explainer naming one symptom whatever the difference (for probes that test one thing)."""
    return lambda case, expected, got: text
