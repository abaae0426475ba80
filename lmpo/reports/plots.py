"""Render :class:`~lmpo.reports.panels.Panel` specs to PNG files.

Uses ``matplotlib.figure.Figure`` with the Agg canvas directly, so the
user's global pyplot backend is never touched.
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, PercentFormatter

from .metrics import Series, align, ema
from .panels import Axis, Curve, Panel
from .rollbacks import Rollback, mark_rollbacks

MIN_SMOOTH_POINTS = 21  # below this, draw raw points only (the EMA's span, n/20, is 1 up to 20 points: no smoothing)
RAW_ALPHA = 0.25
DPI = 100


def new_figure(n_rows: int, width: float = 8.0, row_height: float = 2.8) -> Figure:
    """A constrained-layout figure attached to an Agg canvas."""
    fig = Figure(figsize=(width, row_height * n_rows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI)
    return path


def present_axes(panel: Panel, data: dict[str, Series]) -> list[Axis]:
    """The panel's subplots that have at least one key with data."""
    return [a for a in panel.axes if any(k in data for k in a.keys())]


def render_panel(panel: Panel, data: dict[str, Series], out_dir: Path,
                 rollbacks: list[Rollback] = (), nonfinite: dict[str, list[tuple[float, float]]] | None = None,
                 x_label: str = "step") -> Path | None:
    """Write ``<out_dir>/<panel.name>.png``; None if the panel has no data. Collapse-guard
    ``rollbacks`` are marked on every subplot; a curve's ``nonfinite`` (step, value) points break
    its line and are marked by a dotted line. ``x_label``: what a row's `step` counts (online DPO
    and RFT log one row per round)."""
    axes_specs = present_axes(panel, data)
    if not axes_specs:
        return None
    fig = new_figure(len(axes_specs))
    axs = fig.subplots(len(axes_specs), 1, sharex=True, squeeze=False)[:, 0]
    for ax, spec in zip(axs, axes_specs):
        mark_rollbacks(ax, list(rollbacks))
        draw_axis(ax, spec, data, nonfinite or {})
    axs[-1].set_xlabel(x_label)
    # steps are whole: no tick at 2.5, and with one step in view (a 1-step run) only that one, where
    # the default min_n_ticks=2 gave up on whole numbers and ticked 0.945 ... 1.050
    axs[-1].xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    fig.suptitle(panel.title)
    return save(fig, out_dir / f"{panel.name}.png")


def draw_axis(ax: Axes, spec: Axis, data: dict[str, Series],
              nonfinite: dict[str, list[tuple[float, float]]] | None = None) -> None:
    if spec.stacked:
        draw_stacked(ax, spec, data)
    else:
        curves = [c for c in spec.curves if c.key in data]
        for i, curve in enumerate(curves):
            draw_curve(ax, curve, data, f"C{i}", (nonfinite or {}).get(curve.key, []))
    ax.set_title(spec.title, fontsize=10)
    if spec.ylabel:
        ax.set_ylabel(spec.ylabel)
    if spec.percent:
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
        _within_shares(ax)
    ax.grid(True, alpha=0.3)
    if not ax.get_legend_handles_labels()[0]:
        return
    if spec.stacked:  # a stack fills the axes: keep the legend outside it
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize=8, loc="best")


def _within_shares(ax: Axes) -> None:
    """A share's axis ends at 0% and 100% (autoscaling's margin put ticks at 96–104% around a line
    at 100%), unless a logged value lies beyond them: values are drawn as logged."""
    low, high = ax.get_ylim()
    data = ax.dataLim
    low, high = max(low, 0.0) if data.y0 >= 0 else low, min(high, 1.0) if data.y1 <= 1 else high
    if low < high:
        ax.set_ylim(low, high)


def _smoothed(curve: Curve, ys: list[float]) -> bool:
    return curve.smooth and not curve.sparse and len(ys) >= MIN_SMOOTH_POINTS


def with_gaps(xs: list[float], ys: list[float], gaps: list[float]) -> Series:
    """The points with a NaN at each of ``gaps``, where matplotlib breaks the line."""
    merged = sorted([*zip(xs, ys), *((g, math.nan) for g in gaps)], key=lambda p: p[0])
    return [p[0] for p in merged], [p[1] for p in merged]


def draw_curve(ax: Axes, curve: Curve, data: dict[str, Series], color: str,
               nonfinite: list[tuple[float, float]] = ()) -> None:
    """Raw points (faint) plus an EMA line, or markers for sparse/short series; a gap and a dotted
    line at each step whose value was NaN or ±inf (the EMA runs over the finite points)."""
    xs, ys = data[curve.key]
    gaps = [step for step, _ in nonfinite]
    if _smoothed(curve, ys):
        ax.plot(*with_gaps(xs, ys, gaps), color=color, alpha=RAW_ALPHA, lw=0.8)
        line = ema(ys)
        ax.plot(*with_gaps(xs, line, gaps), color=color, lw=1.8, label=f"{curve.label} (EMA)")
    elif curve.sparse or len(xs) < MIN_SMOOTH_POINTS:
        line = ys
        ax.plot(*with_gaps(xs, ys, gaps), "o-", color=color, ms=3.5, lw=1.2, label=curve.label)
    else:
        line = ys
        ax.plot(*with_gaps(xs, ys, gaps), color=color, lw=1.5, label=curve.label)
    for i, (step, _) in enumerate(nonfinite):
        ax.axvline(step, color=color, ls=":", lw=1.4, label=f"{curve.label}: not finite" if i == 0 else None)
    if curve.band and curve.band in data:
        draw_band(ax, (xs, line), data[curve.band], color, smooth=_smoothed(curve, ys))


def draw_band(ax: Axes, center: Series, std: Series, color: str, smooth: bool) -> None:
    """Shade ``center +- std`` at the steps where both are known."""
    std_at = dict(zip(*std))
    pairs = [(x, y, std_at[x]) for x, y in zip(*center) if x in std_at]
    if not pairs:
        return
    xs = [p[0] for p in pairs]
    sd = [p[2] for p in pairs]
    if smooth and len(sd) >= MIN_SMOOTH_POINTS:
        sd = ema(sd)
    lo = [p[1] - s for p, s in zip(pairs, sd)]
    hi = [p[1] + s for p, s in zip(pairs, sd)]
    ax.fill_between(xs, lo, hi, color=color, alpha=0.15, lw=0, label="+-std")


def draw_stacked(ax: Axes, spec: Axis, data: dict[str, Series]) -> None:
    """Stacked areas of the curves (EMA-smoothed when long) plus the total."""
    curves = [c for c in spec.curves if c.key in data]
    if curves:
        steps = sorted({x for c in curves for x in data[c.key][0]})
        layers = [align(data[c.key], steps) for c in curves]
        labels = [c.label for c in curves]
        if len(steps) >= MIN_SMOOTH_POINTS:
            layers = [ema(layer) for layer in layers]
            labels = [f"{label} (EMA)" for label in labels]
        if len(steps) == 1:  # an area over one step has no width: stackplot drew nothing
            _stacked_bar(ax, steps[0], [layer[0] for layer in layers], labels)
        else:
            ax.stackplot(steps, *layers, labels=labels, alpha=0.85)
    if spec.total and spec.total in data:
        xs, ys = data[spec.total]
        smooth = len(xs) >= MIN_SMOOTH_POINTS  # as the layers: a raw total over smoothed layers read as one more layer
        ax.plot(xs, ema(ys) if smooth else ys, "o-" if len(xs) == 1 else "-", color="black", lw=0.8, alpha=0.5,
                label="total step time" + (" (EMA)" if smooth else ""))
    ax.set_ylim(bottom=0)


def _stacked_bar(ax: Axes, step: float, heights: list[float], labels: list[str]) -> None:
    """The stack of one step as one bar, in the colours stackplot gives its layers."""
    bottom = 0.0
    for i, (height, label) in enumerate(zip(heights, labels)):
        ax.bar(step, height, width=0.6, bottom=bottom, color=f"C{i}", alpha=0.85, label=label)
        bottom += height
