"""How the report's axes are drawn: a share's axis ends at 0% and 100%, and a trainer that logs
one row per round says "round" under its curves."""

from __future__ import annotations

import json
from pathlib import Path

from matplotlib.figure import Figure

from lmpo.reports.panels import Axis, Curve
from lmpo.reports.plots import draw_axis
from lmpo.reports.report import write_report


def _ylim(data: dict, percent: bool = True, stacked: bool = False) -> tuple[float, float]:
    ax = Figure().add_subplot()
    draw_axis(ax, Axis("share", tuple(Curve(k, k) for k in data), percent=percent, stacked=stacked), data)
    return ax.get_ylim()


def test_a_share_axis_ends_at_0_and_100_percent():
    """QA: zero_var at 100% had ticks 96–104%; a stack of shares summing to 1 reached past 100%."""
    steps = [1.0, 2.0, 3.0, 4.0]
    low, high = _ylim({"zero_var_frac": (steps, [1.0] * 4)})
    assert high == 1.0 and 0.9 < low < 1.0  # autoscaled below, no margin past 100%
    low, high = _ylim({"accuracy": (steps, [0.0, 0.0, 0.1, 0.0])})
    assert low == 0.0 and high < 0.2
    assert _ylim({"termination_answered": (steps, [0.5] * 4), "termination_token_budget": (steps, [0.5] * 4)},
                 stacked=True) == (0.0, 1.0)
    assert _ylim({"accuracy": (steps, [0.5, 1.2, 0.9, 1.0])})[1] > 1.2  # a value past 100% is drawn as logged
    assert _ylim({"loss": (steps, [1.0] * 4)}, percent=False)[1] > 1.0  # not a share: autoscaled


def _xlabels(run: Path, monkeypatch) -> set[str]:
    """The x-axis labels `lmpo report` gives the run's figures."""
    import lmpo.reports.report as report

    seen: set[str] = set()
    original = report.render_panel

    def spy(*args, **kwargs):
        seen.add(args[5] if len(args) > 5 else kwargs.get("x_label", "step"))
        return original(*args, **kwargs)

    monkeypatch.setattr(report, "render_panel", spy)
    write_report(run)
    return seen


def test_online_dpo_and_rft_curves_count_rounds(tmp_path: Path, monkeypatch):
    """QA: the x axis of online DPO and RFT said "step" where each row is a round."""
    for trainer, label in (("online_dpo", "round"), ("rft", "round"), ("rl", "step")):
        run = tmp_path / trainer
        run.mkdir()
        (run / "run.json").write_text(json.dumps({"trainer": trainer}))
        rows = [{"step": s, "reward_mean": 0.1 * s, "loss": 1.0 / s} for s in range(1, 5)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert _xlabels(run, monkeypatch) == {label}
