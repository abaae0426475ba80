"""The records every renderer reads: an explanation is a list of steps, each with named values.

The terminal printer, the HTML writer and the markdown writer all render these objects, so the
numbers on every page are the numbers computed here, by `lmpo.algos`, and nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

Cell = float | None  # None: a position the mask leaves out (padding, observation tokens)


@dataclass(frozen=True)
class Value:
    """A named tensor of the example, as plain numbers (rows of cells, even for a scalar)."""

    name: str
    """Key of the value within its explanation, e.g. `advantages`; stable across languages."""
    symbol: str
    """Math symbol shown next to the label, e.g. `A_i`."""
    label: str
    """What it is, in the page's language."""
    rows: tuple[tuple[Cell, ...], ...]
    """The numbers: one row per sequence (or pair), one cell per token; None where masked."""
    given: bool
    """True for the inputs chosen for the example, False for what `lmpo.algos` computed."""
    source: str = ""
    """The function (and options) that computed it, e.g. `ADVANTAGES.get('grpo')(std='sample')`."""
    columns: tuple[str, ...] = ()
    """Header of each column (e.g. `t1`.. for tokens, `y1`.. for sequences)."""
    row_labels: tuple[str, ...] = ()
    """Label of each row (e.g. `y1`.. for token tables); empty for a single row."""

    def numbers(self) -> list[float]:
        """Every unmasked cell, row by row."""
        return [c for row in self.rows for c in row if c is not None]


@dataclass(frozen=True)
class Step:
    """One stage of a worked example: a formula, the values it produces, and what they mean."""

    key: str
    title: str
    formula: str
    values: tuple[Value, ...]
    text: str


@dataclass(frozen=True)
class Diagram:
    """A figure drawn by evaluating the library's own functions on a grid."""

    key: str
    """File stem, e.g. `surrogate_ppo`; the PNG is shared by both languages."""
    caption: str
    draw: Callable[[str], None] = field(compare=False, repr=False)
    """Writes the PNG to the given path."""


@dataclass(frozen=True)
class Explanation:
    """Everything one method's page shows, in one language."""

    method: str
    lang: str
    title: str
    summary: str
    formula: str
    papers: tuple[str, ...]
    commands: tuple[str, ...]
    settings: dict
    when: str
    steps: tuple[Step, ...]
    diagrams: tuple[Diagram, ...]

    def value(self, name: str) -> Value:
        """The value called `name` in any step (KeyError when absent)."""
        for step in self.steps:
            for value in step.values:
                if value.name == name:
                    return value
        raise KeyError(f"{self.method}: no value {name!r}")

    def values(self) -> list[Value]:
        return [v for step in self.steps for v in step.values]


def fmt(x: Cell) -> str:
    """A cell as printed on every page: 6 significant digits, `·` where masked, no `-0`."""
    if x is None:
        return "·"
    if not math.isfinite(x):
        return str(x)
    text = f"{x:.6g}"
    return "0" if text in ("-0", "0") else text


def cells(tensor, mask=None) -> tuple[tuple[Cell, ...], ...]:
    """A tensor ([], [N] or [B,T]) as rows of floats; with `mask` [B,T], None where it is 0.

    A 1-D tensor becomes one row, so that a per-sequence value reads left to right."""
    data = tensor.detach().double()
    if data.dim() == 0:
        return ((float(data),),)
    if data.dim() == 1:
        data = data.unsqueeze(0)
    keep = None if mask is None else (mask != 0).reshape(data.shape)
    return tuple(
        tuple(float(x) if keep is None or bool(keep[i, j]) else None for j, x in enumerate(row.tolist()))
        for i, row in enumerate(data)
    )


def labels(n: int, prefix: str) -> tuple[str, ...]:
    """`prefix1` .. `prefixN`."""
    return tuple(f"{prefix}{i + 1}" for i in range(n))
