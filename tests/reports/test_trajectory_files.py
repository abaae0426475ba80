"""Which file `lmpo trajectories PATH` reads, and what it says of a path that holds none."""

from __future__ import annotations

import json
from pathlib import Path

from lmpo.cli.main import main


def test_a_metrics_file_is_named_as_such_not_read_as_trajectories(tmp_path: Path, capsys) -> None:
    """QA: `lmpo trajectories RUN/metrics.jsonl` said `metrics.jsonl:1: missing key 'phase'`."""
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.parent.mkdir()
    metrics.write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n")
    assert main(["trajectories", str(metrics)]) == 2
    err = capsys.readouterr().err
    assert "is a run's metrics, not trajectories" in err and str(metrics.parent) in err
    assert "missing key" not in err
