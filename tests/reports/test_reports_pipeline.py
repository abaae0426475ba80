"""write_report on a pipeline directory with summary.json."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from lmpo.reports import write_report


def test_pipeline_writes_stage_chart_and_stage_reports(
    pipeline_report: Path, rh: SimpleNamespace
) -> None:
    pipe = pipeline_report.parent.parent
    assert pipeline_report == pipe / "report" / "report.html"
    rh.assert_png(pipe / "report" / "stages.png")
    srcs = rh.img_srcs(pipeline_report)
    assert srcs[0] == "stages.png"
    for stage in ["cpt", "sft", "grpo"]:
        assert (pipe / stage / "report" / "report.html").is_file()
    assert "../sft/report/loss.png" in srcs
    assert "../grpo/report/reward.png" in srcs
    for src in srcs:  # every embedded image resolves from the html's folder
        rh.assert_png((pipeline_report.parent / src).resolve())


def test_pipeline_html_content(pipeline_report: Path) -> None:
    text = pipeline_report.read_text(encoding="utf-8")
    assert "31.0%" in text and "90.0%" in text and "<td>init</td>" in text
    assert "grpo &lt;rl&gt;" in text and "grpo <rl>" not in text
    assert 'href="../grpo/report/report.html"' in text
    assert "tiny-model" in text  # other summary keys are shown


def test_pipeline_without_stage_dirs(tmp_path: Path, rh: SimpleNamespace) -> None:
    summary = {"stages": [{"name": "init", "accuracy": 0.1},
                          {"name": "sft", "accuracy": 0.3, "run_dir": "missing"}]}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    html = write_report(tmp_path)
    assert rh.img_srcs(html) == ["stages.png"]
    rh.assert_png(tmp_path / "report" / "stages.png")


def test_stage_pointing_at_pipeline_dir_does_not_recurse(
    tmp_path: Path, rh: SimpleNamespace
) -> None:
    rh.write_jsonl(tmp_path / "metrics.jsonl", [{"step": i, "loss": 1 / (i + 1)} for i in range(5)])
    summary = {"stages": [{"name": "self", "accuracy": 0.2, "run_dir": "."}]}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert rh.img_srcs(write_report(tmp_path)) == ["stages.png", "loss.png"]


def test_broken_stage_is_reported_not_fatal(tmp_path: Path, rh: SimpleNamespace) -> None:
    (tmp_path / "cpt").mkdir()
    (tmp_path / "cpt" / "metrics.jsonl").write_text('{"step": 0}\n{"step": 2}\n')
    (tmp_path / "cpt" / "report").write_text("a file where the stage's report directory goes")
    summary = {"stages": [{"name": "cpt", "accuracy": 0.2, "run_dir": "cpt"}]}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    with pytest.warns(RuntimeWarning, match="stage 'cpt'"):
        html = write_report(tmp_path)
    assert "could not write report for stage" in html.read_text(encoding="utf-8")
    rh.assert_png(tmp_path / "report" / "stages.png")


def test_bad_summary_raises(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text('{"stages": 3}')
    with pytest.raises(ValueError, match="'stages' must be a list"):
        write_report(tmp_path)
    (tmp_path / "summary.json").write_text('{"stages": [')
    with pytest.raises(ValueError, match="summary.json: invalid JSON"):
        write_report(tmp_path)
