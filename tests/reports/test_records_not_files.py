"""A run's metrics.jsonl that is a directory: `lmpo doctor RUN` said the run had no metrics.jsonl,
`lmpo report RUN` that it had neither metrics.jsonl nor summary.json, and the report of its
pipeline left the stage out without a word. Each now names the path and what is wrong with it."""

from __future__ import annotations

import html
import shutil
from pathlib import Path

import pytest

from lmpo.cli.main import main

HEALTHY = Path(__file__).parent.parent / "data" / "healthy_sort_pipeline"


@pytest.fixture
def pipeline(tmp_path) -> Path:
    run = tmp_path / "pipe"
    shutil.copytree(HEALTHY, run)
    (run / "grpo" / "metrics.jsonl").unlink()
    (run / "grpo" / "metrics.jsonl").mkdir()
    return run


@pytest.mark.parametrize("command", ["doctor", "report"])
def test_the_run_itself(command, pipeline, capsys):
    assert main([command, str(pipeline / "grpo")]) == 2
    assert capsys.readouterr().err == (f"lmpo: error: {pipeline / 'grpo' / 'metrics.jsonl'} is a directory, where "
                                       f"the run's metrics.jsonl file belongs; move it aside\n")


def test_a_stage_of_the_pipeline_is_not_left_out_silently(pipeline, capsys):
    assert main(["report", str(pipeline)]) == 0
    said = f"stage 'grpo': {pipeline / 'grpo' / 'metrics.jsonl'} is a directory, where the run's metrics.jsonl"
    assert f"lmpo: warning: {said}" in capsys.readouterr().err
    assert html.escape(said) in (pipeline / "report" / "report.html").read_text()
