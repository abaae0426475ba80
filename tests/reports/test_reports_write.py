"""write_report on single runs, and the CLI."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from lmpo.reports import write_report
from lmpo.reports.__main__ import main

RL_PLOTS = ["reward", "accuracy", "kl", "entropy", "length", "zero_var",
            "optim", "phase_time", "loss"]


def test_rl_run_writes_all_panels(rl_report: Path, rh: SimpleNamespace) -> None:
    assert rl_report.name == "report.html" and rl_report.parent.name == "report"
    srcs = rh.img_srcs(rl_report)
    for name in RL_PLOTS:
        rh.assert_png(rl_report.parent / f"{name}.png")
        assert f"{name}.png" in srcs
    assert srcs[0] == "reward.png"  # RL runs lead with reward
    assert "throughput.png" not in srcs  # tokens_per_s never logged


def test_rl_html_has_final_values_table(rl_report: Path) -> None:
    text = rl_report.read_text(encoding="utf-8")
    assert "<title>Report: grpo</title>" in text
    assert "<td>eval_accuracy</td>" in text and "<td>reward_mean</td>" in text
    assert "<script" not in text and "<link" not in text  # self-contained
    assert "http://" not in text and "https://" not in text


def test_sft_run_writes_loss_and_skips_rl_panels(sft_run: Path, rh: SimpleNamespace) -> None:
    html = write_report(str(sft_run))
    srcs = rh.img_srcs(html)
    assert srcs == ["loss.png", "accuracy.png", "optim.png", "throughput.png"]
    for src in srcs:
        rh.assert_png(html.parent / src)
    for name in ["reward", "kl", "entropy", "length", "zero_var", "phase_time"]:
        assert not (sft_run / "report" / f"{name}.png").exists()


def test_sparse_and_missing_keys_do_not_crash(tmp_path: Path, rh: SimpleNamespace) -> None:
    rows = rh.rl_rows(15)
    for i, row in enumerate(rows):  # drop keys at scattered places
        for key in list(row):
            if key != "step" and (i + len(key)) % 3 == 0:
                del row[key]
    rows[3]["reward_std"] = None
    rows[4]["kl"] = "nan?"
    rows[5]["entropy"] = float("nan")
    rows.append({"step": 15, "eval_accuracy": 0.5})
    rh.write_jsonl(tmp_path / "metrics.jsonl", rows)
    with pytest.warns(RuntimeWarning) as caught:
        html = write_report(tmp_path)
    said = [str(w.message) for w in caught]
    assert any("line 5: 'kl' is a string" in m for m in said) and any("entropy: nan at step 5" in m for m in said)
    assert len(rh.img_srcs(html)) >= 8
    for src in rh.img_srcs(html):
        rh.assert_png(html.parent / src)


def test_single_row_and_only_reward_mean(tmp_path: Path, rh: SimpleNamespace) -> None:
    rh.write_jsonl(tmp_path / "metrics.jsonl", [{"step": 1, "reward_mean": 0.5}])
    html = write_report(tmp_path)
    assert rh.img_srcs(html) == ["reward.png"]
    rh.assert_png(tmp_path / "report" / "reward.png")


def test_empty_metrics_file_still_writes_page(tmp_path: Path, rh: SimpleNamespace) -> None:
    (tmp_path / "metrics.jsonl").write_text("")
    html = write_report(tmp_path)
    assert "No numeric metrics logged yet." in html.read_text(encoding="utf-8")
    assert rh.img_srcs(html) == []
    (tmp_path / "result.json").write_text("{}")  # finished: there is no "yet" to it
    text = write_report(tmp_path).read_text(encoding="utf-8")
    assert "No numeric metrics were logged: the run finished without a row." in text and "yet" not in text


def test_a_malformed_metrics_line_is_skipped_with_its_line_number(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "loss": 1}\nnot json\n{"step": 2, "loss": 0.5}\n')
    with pytest.warns(RuntimeWarning, match="line 2: skipping damaged line"):
        html = write_report(tmp_path)
    assert "loss" in html.read_text(encoding="utf-8")


def test_truncated_last_line_warns_but_reports(tmp_path: Path, rh: SimpleNamespace) -> None:
    rows = [{"step": i, "reward_mean": 0.1 * i} for i in range(5)]
    path = rh.write_jsonl(tmp_path / "metrics.jsonl", rows)
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"step": 5, "reward_me')
    with pytest.warns(RuntimeWarning, match="truncated"):
        html = write_report(tmp_path)
    assert rh.img_srcs(html) == ["reward.png"]


def test_empty_or_missing_directory_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="neither metrics.jsonl nor summary.json"):
        write_report(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_report(tmp_path / "nope")
    assert not (tmp_path / "report").exists()


def test_cli_main(tmp_path: Path, rh: SimpleNamespace,
                  capsys: pytest.CaptureFixture[str]) -> None:
    rh.write_jsonl(tmp_path / "run" / "metrics.jsonl", [{"step": 0, "loss": 1.0}])
    assert main([str(tmp_path / "run")]) == 0
    assert capsys.readouterr().out.strip().endswith("report.html")
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 1
    assert "neither" in capsys.readouterr().err


def test_python_dash_m(tmp_path: Path, rh: SimpleNamespace) -> None:
    rh.write_jsonl(tmp_path / "metrics.jsonl", [{"step": 0, "loss": 1.0}])
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "lmpo.reports", str(tmp_path)],
        cwd=root, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("report.html")
    rh.assert_png(tmp_path / "report" / "loss.png")


def test_does_not_import_pyplot(tmp_path: Path, rh: SimpleNamespace) -> None:
    """The user's global pyplot backend must stay untouched."""
    rh.write_jsonl(tmp_path / "metrics.jsonl", [{"step": 0, "loss": 1.0}])
    code = (
        "import sys; from lmpo.reports import write_report; "
        f"write_report({str(tmp_path)!r}); "
        "assert 'matplotlib.pyplot' not in sys.modules"
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", code], cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_a_preference_run_plots_pair_accuracy_and_its_rewards(tmp_path: Path, rh: SimpleNamespace) -> None:
    """A DPO run's `accuracy` (pairs ranked right) was drawn as "Answer accuracy — train batch"
    beside held-out answer accuracy, and its margin and chosen/rejected rewards not at all."""
    from lmpo.reports.panels import panels_for

    rows = [{"step": 0, "eval_accuracy": 0.35, "eval_format_accuracy": 1.0}]
    rows += [{"step": s, "loss": 0.7 - 0.005 * s, "chosen_logps": -3.0, "rejected_logps": -20.0 - 0.1 * s,
              "chosen_reward": 0.01 * s, "rejected_reward": -0.005 * s, "margin": 0.015 * s,
              "accuracy": min(1.0, 0.5 + 0.01 * s), "grad_norm": 2.0, "lr": 5e-5} for s in range(5, 80, 5)]
    rows[-1].update(eval_accuracy=0.4, eval_format_accuracy=1.0)
    rh.write_jsonl(tmp_path / "dpo" / "metrics.jsonl", rows)
    html = write_report(tmp_path / "dpo")
    assert rh.img_srcs(html) == ["loss.png", "accuracy.png", "preference.png", "optim.png"]
    rh.assert_png(html.parent / "preference.png")
    keys = {k for row in rows for k in row}
    accuracy = next(p for p in panels_for(keys) if p.name == "accuracy")
    pair, answer = accuracy.axes[:2]
    assert pair.title.startswith("Pair accuracy") and [c.key for c in pair.curves] == ["accuracy"]
    assert answer.title == "Answer accuracy" and [c.key for c in answer.curves] == ["eval_accuracy"]
    preference = next(p for p in panels_for(keys) if p.name == "preference")
    assert [c.key for a in preference.axes for c in a.curves][:2] == ["chosen_reward", "rejected_reward"]
    rl = next(p for p in panels_for(["reward_mean", "accuracy"]) if p.name == "accuracy")
    assert rl.axes[0].title == "Answer accuracy"  # RL's accuracy is answer accuracy


def test_a_reward_model_run_plots_its_held_out_pairwise_accuracy_as_such(tmp_path: Path, rh: SimpleNamespace) -> None:
    """QA: `lmpo report` on a reward model's run drew its held-out pairwise accuracy (logged as
    `eval_accuracy`) in the panel "Answer accuracy", legend "held-out eval". A run whose run.json
    says trainer "rm" now has one pairwise-accuracy axis, train and held-out pairs, in the PNG and
    the HTML; a DPO run's `eval_accuracy` stays answer accuracy."""
    import json

    from lmpo.reports.panels import panels_for

    rows = [{"step": s, "loss": 0.7 - 0.005 * s, "accuracy": min(1.0, 0.5 + 0.01 * s), "margin": 0.02 * s,
             "grad_norm": 1.0, "lr": 1e-3} for s in range(1, 40, 3)]
    rows.append({"step": 37, "eval_accuracy": 0.68})
    rh.write_jsonl(tmp_path / "rm" / "metrics.jsonl", rows)
    (tmp_path / "rm" / "run.json").write_text(json.dumps({"trainer": "rm", "command": "rm", "config": {}}))
    html = write_report(tmp_path / "rm")
    text = html.read_text()
    assert 'alt="Pairwise accuracy (reward model)"' in text and "Answer accuracy" not in text
    assert "<td>eval_accuracy (pairwise, held-out pairs)</td>" in text
    rh.assert_png(html.parent / "accuracy.png")
    keys = {k for row in rows for k in row}
    (axis,) = next(p for p in panels_for(keys, "rm") if p.name == "accuracy").axes
    assert axis.title.startswith("Pairwise accuracy") and [(c.key, c.label) for c in axis.curves] == [
        ("accuracy", "train pairs"), ("eval_accuracy", "held-out pairs")]
    answer = next(p for p in panels_for(keys, "dpo") if p.name == "accuracy").axes[1]
    assert answer.title == "Answer accuracy" and [c.key for c in answer.curves] == ["eval_accuracy"]


def test_a_ppo_run_plots_its_critic(tmp_path: Path, rh: SimpleNamespace) -> None:
    """value_loss, value_mean and value_clip_frac were logged by PPO and never plotted."""
    rows = rh.rl_rows(20)
    for row in rows:
        row.update(value_loss=0.3 / (1 + row["step"]), value_mean=0.01 * row["step"], value_clip_frac=0.05)
    rh.write_jsonl(tmp_path / "ppo" / "metrics.jsonl", rows)
    html = write_report(tmp_path / "ppo")
    srcs = rh.img_srcs(html)
    assert srcs.index("critic.png") == srcs.index("optim.png") + 1
    rh.assert_png(html.parent / "critic.png")


def test_steps_are_ticked_at_whole_numbers(tmp_path: Path, rh: SimpleNamespace, monkeypatch) -> None:
    """A 20-step RL run's plots had ticks at 2.5, 7.5, 12.5 and 17.5."""
    from lmpo.reports import plots
    from lmpo.reports.metrics import all_series
    from lmpo.reports.panels import PANELS

    figures = []
    monkeypatch.setattr(plots, "save", lambda fig, path: figures.append(fig) or path)
    data = all_series([{"step": s, "kl": 0.01 * s} for s in range(1, 21)])
    plots.render_panel(next(p for p in PANELS if p.name == "kl"), data, tmp_path)
    ticks = [t for t in figures[0].axes[-1].get_xticks() if 1 <= t <= 20]
    assert ticks and all(t == int(t) for t in ticks)
    # one step: MaxNLocator gave up on whole numbers (one in view) and ticked 0.945 ... 1.050
    plots.render_panel(next(p for p in PANELS if p.name == "kl"), all_series([{"step": 1, "kl": 0.1}]), tmp_path)
    axis = figures[1].axes[-1]
    low, high = axis.get_xlim()
    assert [t for t in axis.get_xticks() if low <= t <= high] == [1.0]


def test_the_kl_plot_names_the_estimator_behind_kl(tmp_path: Path, rh: SimpleNamespace) -> None:
    """PPO's `kl` (k1, the log-ratio) went below 0 under the title "KL divergence to reference"."""
    titles = {}
    for name, record in (("ppo", {"trainer": "rl", "command": "ppo", "config": {"kl_estimator": "k1"}}),
                         ("grpo", {"trainer": "rl", "command": "grpo", "config": {"kl_estimator": "k3"}}),
                         ("kto", {"trainer": "kto", "command": "kto", "config": {}}), ("bare", None)):
        rh.write_jsonl(tmp_path / name / "metrics.jsonl", rh.rl_rows())
        if record:
            (tmp_path / name / "run.json").write_text(json.dumps(record))
        html = write_report(tmp_path / name).read_text(encoding="utf-8")
        titles[name] = re.search(r'src="kl\.png" alt="([^"]*)"', html).group(1)
    assert titles == {"ppo": "KL to reference (k1 estimate per token; can dip below 0)",
                      "grpo": "KL to reference (k3 estimate per token; never below 0)",
                      "kto": "KTO reference point z0 (batch KL estimate, clamped at 0)",
                      "bare": "KL to reference (per-token estimate; k1 can dip below 0)"}


def test_an_unfinished_run_is_said_to_be_one(tmp_path: Path, rh: SimpleNamespace, capsys) -> None:
    """A run with no result.json was interrupted (or is still running): the page and the command
    say so, with its newest complete checkpoint and the command that resumes it."""
    from lmpo.cli.main import main as lmpo

    run = tmp_path / "grpo"
    rh.write_jsonl(run / "metrics.jsonl", rh.rl_rows())
    (run / "run.json").write_text('{"trainer": "rl", "command": "dapo", "config": {}}')
    for step, complete in ((2, True), (4, True), (6, False)):  # step 6 was being written
        (run / "checkpoints" / f"step_{step:06d}").mkdir(parents=True)
        if complete:
            (run / "checkpoints" / f"step_{step:06d}" / "COMPLETE").write_text("ok\n")
    assert lmpo(["report", str(run)]) == 0
    said = capsys.readouterr().out
    assert f"newest complete checkpoint is step_000004; `lmpo train dapo --resume {run}`" in said
    assert "has not finished" in (run / "report" / "report.html").read_text()
    (run / "result.json").write_text("{}")
    assert lmpo(["report", str(run)]) == 0
    assert "note" not in capsys.readouterr().out
    assert "has not finished" not in (run / "report" / "report.html").read_text()
    shutil.rmtree(run / "checkpoints")
    (run / "result.json").unlink()
    assert lmpo(["report", str(run)]) == 0
    assert "stopped before its first checkpoint" in capsys.readouterr().out


def test_a_pipeline_is_finished_by_its_summary_and_its_stages_resume_with_it(
        tmp_path: Path, rh: SimpleNamespace, capsys) -> None:
    """A pipeline directory has run.json and never result.json: it finished when it wrote
    summary.json. A stage's hint resumes the pipeline, which runs the stages after it. An interrupted
    pipeline (no summary.json) names its stages' reports instead of "nothing to report"."""
    from lmpo.cli.main import main as lmpo

    pipe = tmp_path / "p"
    rh.write_jsonl(pipe / "cpt" / "metrics.jsonl", rh.sft_rows())
    (pipe / "run.json").write_text('{"trainer": "pipeline", "command": null, "config": {}}')
    (pipe / "cpt" / "run.json").write_text('{"trainer": "cpt", "command": null, "config": {}}')
    (pipe / "cpt" / "checkpoints" / "step_000010").mkdir(parents=True)
    (pipe / "cpt" / "checkpoints" / "step_000010" / "COMPLETE").write_text("ok\n")
    assert lmpo(["report", str(pipe)]) == 2
    assert f"is a pipeline that has not finished (no summary.json); report its stages: lmpo report {pipe / 'cpt'}; " \
           f"if it was interrupted, `lmpo pipeline --resume {pipe}` continues it" in capsys.readouterr().err
    assert lmpo(["report", str(pipe / "cpt")]) == 0
    assert f"`lmpo pipeline --resume {pipe}` continues" in capsys.readouterr().out  # the stages after it run too
    (pipe / "summary.json").write_text('{"stages": []}')
    assert lmpo(["report", str(pipe)]) == 0
    assert "note" not in capsys.readouterr().out


def nan_rows() -> list[dict]:
    rows = [{"step": s, "loss": 1.0 / s, "kl": 0.0, "reward_mean": 0.1} for s in range(1, 9)]
    rows[2] |= {"loss": float("nan"), "kl": float("inf")}
    rows[4]["kl"] = float("-inf")
    return rows


def test_non_finite_values_are_said_tabled_and_marked(tmp_path: Path, rh: SimpleNamespace, monkeypatch) -> None:
    """The report dropped NaN/inf without a word and drew the line straight over them: kl read 0 at
    min and max, and a diverged run looked flat and healthy (QA F4)."""
    from lmpo.reports import plots

    figures = []
    monkeypatch.setattr(plots, "save", lambda fig, path: figures.append((path.stem, fig)) or path)
    rh.write_jsonl(tmp_path / "run" / "metrics.jsonl", nan_rows())
    with pytest.warns(RuntimeWarning, match=r"non-finite values.*loss: nan at step 3; kl: inf at step 3, -inf at step 5"):
        html = write_report(tmp_path / "run").read_text()
    assert "<th>non-finite</th>" in html and "<td>inf at step 3, -inf at step 5</td>" in html
    kl = dict(figures)["kl"].axes[0]
    xs, ys = kl.lines[0].get_data()
    assert list(xs) == [1, 2, 3, 4, 5, 6, 7, 8] and [y != y for y in ys] == [False, False, True, False, True,
                                                                            False, False, False]
    assert {tuple(line.get_xdata()) for line in kl.lines[1:]} == {(3, 3), (5, 5)}  # the dotted markers
    assert any("not finite" in text.get_text() for text in kl.get_legend().get_texts())


def test_a_one_step_run_draws_its_stacks(tmp_path: Path, monkeypatch) -> None:
    """stackplot over a single step draws nothing: a 1-step run's termination and phase-time plots
    had a legend and no area (QA F8)."""
    from lmpo.reports import plots
    from lmpo.reports.metrics import all_series
    from lmpo.reports.panels import PANELS

    figures = []
    monkeypatch.setattr(plots, "save", lambda fig, path: figures.append(fig) or path)
    row = {"step": 1, "time_generate": 2.0, "time_update": 1.0, "time_step": 3.0}
    plots.render_panel(next(p for p in PANELS if p.name == "phase_time"), all_series([row]), tmp_path)
    ax = figures[0].axes[0]
    bars = [(p.get_x() + p.get_width() / 2, p.get_y(), p.get_height()) for p in ax.patches]
    assert bars == [(1.0, 0.0, 2.0), (1.0, 2.0, 1.0)]
    assert ax.lines[0].get_marker() == "o"  # the total, one point


def test_a_curve_is_called_an_ema_only_when_it_is_smoothed():
    """Up to 20 points the EMA's span is 1 (no smoothing), yet 10-20 points were labelled '(EMA)'
    over a copy of the raw line; a stacked panel's total stayed raw over smoothed layers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lmpo.reports.panels import Axis, Curve
    from lmpo.reports.plots import draw_curve, draw_stacked

    for n, label in ((15, "loss"), (30, "loss (EMA)")):
        fig, ax = plt.subplots()
        draw_curve(ax, Curve("loss", "loss"), {"loss": (list(range(n)), [float(i % 3) for i in range(n)])}, "C0")
        assert [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")] == [label]
        plt.close(fig)
    fig, ax = plt.subplots()
    steps = list(range(30))
    draw_stacked(ax, Axis("t", (Curve("a", "a"),), stacked=True, total="time_step"),
                 {"a": (steps, [1.0] * 30), "time_step": (steps, [float(i % 2) for i in steps])})
    total = next(line for line in ax.get_lines() if line.get_label().startswith("total"))
    assert total.get_label() == "total step time (EMA)" and max(total.get_ydata()) < 1.0
    plt.close(fig)


def test_a_run_on_a_read_only_file_system_is_told_to_report_a_copy(tmp_path, monkeypatch, capsys):
    import errno

    from lmpo.cli.main import main

    def read_only(run_dir):
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / "report"))

    monkeypatch.setattr("lmpo.reports.write_report", read_only)
    assert main(["report", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"lmpo: error: cannot write {tmp_path / 'report'}: read-only file system")
    assert f"copy the run somewhere writable (cp -r {tmp_path} /tmp/) and report the copy" in err


def test_a_comparison_directory_is_pointed_to_its_page_and_runs(tmp_path, capsys):
    from lmpo.cli.main import main

    (tmp_path / "compare.html").write_text("<html></html>")
    (tmp_path / "seed0" / "grpo" / "grpo").mkdir(parents=True)
    (tmp_path / "seed0" / "grpo" / "grpo" / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"is a comparison (lmpo compare): its page is {tmp_path / 'compare.html'}" in err
    assert f"lmpo report {tmp_path / 'seed0' / 'grpo' / 'grpo'}" in err
