"""The collapse guard's rollbacks in a run's metrics: a table, and markers on every curve.

The RL loop logs one row per rollback (`rollback`: the alarm in words, `to_step`: the checkpoint
it went back to, `lr_scale`, `new_lr`); the steps after `to_step` are then trained and logged
again, so the curves show the run that was kept and the markers show where the guard acted."""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.axes import Axes

from . import page
from .metrics import Row, as_float

MARKER_COLOR = "#c0392b"


@dataclass(frozen=True)
class Rollback:
    step: float
    """The step whose metrics raised the alarm."""
    to_step: float | None
    """The checkpoint's step the run went back to."""
    reason: str
    lr_scale: float | None
    """The learning rate's factor against the run's own schedule after the rollback."""
    new_lr: float | None
    """The learning rate right after the rollback (runs logged before it was recorded: None)."""


def read_rollbacks(rows: list[Row]) -> list[Rollback]:
    return [Rollback(as_float(r.get("step")) or 0.0, as_float(r.get("to_step")), str(r["rollback"]),
                     as_float(r.get("lr_scale")), as_float(r.get("new_lr")))
            for r in rows if "rollback" in r]


def without_rollbacks(rows: list[Row]) -> list[Row]:
    """The training rows: a rollback row's figures (`to_step`, `lr_scale`) are not curves."""
    return [r for r in rows if "rollback" not in r]


def mark_rollbacks(ax: Axes, rollbacks: list[Rollback]) -> None:
    """A dashed line at each alarm's step and a shaded band over the steps it undid."""
    for i, rb in enumerate(rollbacks):
        ax.axvline(rb.step, color=MARKER_COLOR, ls="--", lw=1.2, alpha=0.8, label="rollback" if i == 0 else None)
        if rb.to_step is not None and rb.to_step < rb.step:
            ax.axvspan(rb.to_step, rb.step, color=MARKER_COLOR, alpha=0.07, lw=0)


def _num(x: float | None, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def rollback_section(rollbacks: list[Rollback]) -> list[str]:
    if not rollbacks:
        return []
    rows = [[page.cell(_num(rb.step, "g"), numeric=True), page.cell(_num(rb.to_step, "g"), numeric=True),
             page.cell(rb.reason), page.cell(_num(rb.lr_scale, "g"), numeric=True),
             page.cell(_num(rb.new_lr, ".3g"), numeric=True)] for rb in rollbacks]
    note = ("The collapse guard went back to the last complete checkpoint with a lower learning rate; the "
            "dashed lines on the curves mark the alarms, the shaded bands the steps that were trained again.")
    return [page.heading("Collapse-guard rollbacks", 3), page.paragraph(note),
            page.table(["alarm at step", "back to step", "reason", "lr scale", "new learning rate"], rows)]
