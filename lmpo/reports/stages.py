"""Pipeline ``summary.json``: parsing and the per-stage bar chart."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.ticker import PercentFormatter

from .metrics import as_float, json_error
from .plots import new_figure, save


@dataclass(frozen=True)
class Stage:
    name: str
    accuracy: float | None = None
    format_accuracy: float | None = None
    seconds: float | None = None
    run_dir: str | None = None
    pairwise_accuracy: float | None = None
    """A reward model's held-out pairwise accuracy (``kind`` "reward_model": ppo_rm's ``rm`` stage)."""
    kind: str = "policy"

    @property
    def label(self) -> str:
        return f"{self.name} (reward model)" if self.kind == "reward_model" else self.name


def read_summary(path: Path) -> tuple[list[Stage], dict[str, Any]]:
    """Parse a pipeline ``summary.json`` into stages and the remaining keys."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: {json_error(exc, f'line {exc.lineno}')}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    raw_stages = data.get("stages", [])
    if not isinstance(raw_stages, list):
        raise ValueError(f"{path}: 'stages' must be a list, got {type(raw_stages).__name__}")
    stages = [_parse_stage(path, i, s) for i, s in enumerate(raw_stages)]
    extras = {k: v for k, v in data.items() if k != "stages"}
    return stages, extras


def _parse_stage(path: Path, index: int, raw: Any) -> Stage:
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: stages[{index}] must be an object, got {type(raw).__name__}")
    run_dir = raw.get("run_dir")
    return Stage(
        name=str(raw.get("name", f"stage {index}")),
        accuracy=_finite(raw.get("accuracy")),
        format_accuracy=_finite(raw.get("format_accuracy")),
        seconds=_finite(raw.get("seconds")),
        run_dir=str(run_dir) if run_dir else None,
        pairwise_accuracy=_finite(raw.get("pairwise_accuracy")),
        kind=str(raw.get("kind") or "policy"),
    )


def _finite(value: Any) -> float | None:
    x = as_float(value)
    return x if x is not None and math.isfinite(x) else None


def fmt_pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100.0 * x:.1f}%"


def fmt_seconds(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.1f}s" if x < 120 else f"{x / 60.0:.1f}min"


def render_stages(stages: list[Stage], out_dir: Path) -> Path | None:
    """Write ``stages.png``: accuracies per stage and seconds per stage."""
    has_acc = any(s.accuracy is not None or s.format_accuracy is not None or s.pairwise_accuracy is not None
                  for s in stages)
    has_sec = any(s.seconds is not None for s in stages)
    if not stages or not (has_acc or has_sec):
        return None
    fig = new_figure(int(has_acc) + int(has_sec), width=max(6.0, 1.3 * len(stages) + 2))
    axs = list(fig.subplots(int(has_acc) + int(has_sec), 1, squeeze=False)[:, 0])
    if has_acc:
        _accuracy_bars(axs.pop(0), stages)
    if has_sec:
        _seconds_bars(axs.pop(0), stages)
    fig.suptitle("Pipeline stages")
    return save(fig, out_dir / "stages.png")


def _accuracy_bars(ax: Axes, stages: list[Stage]) -> None:
    policies = [s.kind != "reward_model" for s in stages]  # a reward model has no answers to score
    series = [("accuracy", [s.accuracy for s in stages], policies)]
    fmt = [s.format_accuracy for s in stages]
    if any(v is not None for v in fmt):
        series.append(("format accuracy", fmt, policies))
    pairwise = [s.pairwise_accuracy for s in stages]
    if any(v is not None for v in pairwise):
        series.append(("pairwise accuracy (reward model)", pairwise, [not p for p in policies]))
    width = 0.8 / len(series)
    for j, (label, values, shown) in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(stages))]
        heights = [v if v is not None else 0.0 for v in values]
        bars = ax.bar(xs, heights, width, label=label, color=f"C{j if j < 2 else 3}")
        ax.bar_label(bars, labels=[fmt_pct(v) if on else "" for v, on in zip(values, shown)], fontsize=8, padding=2)
    ax.set_ylim(0, 1.3)
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    ax.set_title("Held-out accuracy after each stage", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", ncol=2, frameon=False)
    _stage_ticks(ax, stages)


def _seconds_bars(ax: Axes, stages: list[Stage]) -> None:
    values = [s.seconds for s in stages]
    bars = ax.bar(range(len(stages)), [v or 0.0 for v in values], 0.6, color="C2")
    ax.bar_label(bars, labels=[fmt_seconds(v) for v in values], fontsize=8, padding=2)
    ax.set_ylabel("seconds")
    ax.set_title("Wall-clock time per stage", fontsize=10)
    ax.margins(y=0.15)
    _stage_ticks(ax, stages)


def _stage_ticks(ax: Axes, stages: list[Stage]) -> None:
    ax.set_xticks(range(len(stages)))
    rotation = 30 if len(stages) > 6 else 0
    ax.set_xticklabels([s.label for s in stages], rotation=rotation, ha="right" if rotation else "center")
    ax.grid(True, axis="y", alpha=0.3)
