"""Small evidence plots as PNG bytes (matplotlib's Agg canvas; pyplot's global state untouched).
Labels stay in English in every language: no CJK font can be assumed on the machine."""

from __future__ import annotations

import io
from typing import Sequence

from matplotlib.axes import Axes

from lmpo.reports.plots import new_figure

DPI = 90


def figure(n_cols: int = 1, width: float = 4.2, height: float = 2.9):
    """(figure, list of axes side by side)."""
    fig = new_figure(1, width=width * n_cols, row_height=height)
    axes = fig.subplots(1, n_cols, squeeze=False)[0]
    return fig, list(axes)


def png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def lines(ax: Axes, series: dict[str, tuple[Sequence[float], Sequence[float]]], title: str, xlabel: str,
          ylabel: str, marker: str = "") -> None:
    """One line per label: (x values, y values)."""
    for label, (xs, ys) in series.items():
        ax.plot(list(xs), list(ys), marker=marker, label=label, linewidth=1.4)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=8)


def bars(ax: Axes, values: dict[str, float], title: str, ylabel: str) -> None:
    labels = list(values)
    ax.bar(range(len(labels)), [values[k] for k in labels], color="#4a7fb5")
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, axis="y")


def rolling(xs: Sequence[float], k: int = 5) -> list[float]:
    """Trailing mean over up to `k` points (noisy per-step curves made readable)."""
    xs = list(xs)
    return [sum(xs[max(0, i - k + 1): i + 1]) / len(xs[max(0, i - k + 1): i + 1]) for i in range(len(xs))]
