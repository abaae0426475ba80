"""Fake run directories for the report tests."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lmpo.reports import write_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def rl_rows(n: int = 40, eval_every: int = 10) -> list[dict[str, Any]]:
    rows = []
    for step in range(n):
        row: dict[str, Any] = {
            "step": step,
            "reward_mean": 0.2 + 0.01 * step + 0.05 * math.sin(step),
            "reward_std": 0.3,
            "accuracy": min(1.0, 0.1 + 0.015 * step),
            "format_accuracy": min(1.0, 0.5 + 0.02 * step),
            "kl": 0.001 * step,
            "entropy": 1.5 - 0.01 * step,
            "clip_frac": 0.05,
            "completion_len_mean": 120 + step,
            "completion_len_max": 256,
            "truncated_frac": 0.02,
            "zero_var_frac": 0.4 - 0.005 * step,
            "grad_norm": 1.0 + 0.1 * math.cos(step),
            "lr": 1e-6,
            "loss": 0.01 * math.sin(step),
            "time_generate": 2.0,
            "time_score": 0.1,
            "time_logprobs": 0.5,
            "time_advantages": 0.01,
            "time_update": 1.0,
            "time_step": 3.7,
        }
        if step % eval_every == 0 or step == n - 1:
            row["eval_accuracy"] = 0.1 + 0.01 * step
            row["eval_format_accuracy"] = 0.6 + 0.005 * step
        rows.append(row)
    return rows


def sft_rows(n: int = 25) -> list[dict[str, Any]]:
    rows = []
    for step in range(1, n + 1):
        row: dict[str, Any] = {"step": step, "loss": 2.0 / step, "lr": 1e-5 * min(1, step / 5)}
        if step % 5 == 0:
            row["tokens_per_s"] = 1000.0 + step
        rows.append(row)
    rows.append({"step": n, "eval_accuracy": 0.25, "eval_format_accuracy": 0.8})
    return rows


def assert_png(path: Path) -> None:
    assert path.is_file(), f"missing {path}"
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE), f"{path} is not a PNG"
    assert len(data) > 2000, f"{path} is suspiciously small ({len(data)} bytes)"


def img_srcs(html_path: Path) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', html_path.read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def rh() -> SimpleNamespace:
    """Helpers for test modules (fixtures avoid importing ``conftest``)."""
    return SimpleNamespace(write_jsonl=write_jsonl, rl_rows=rl_rows, sft_rows=sft_rows,
                           assert_png=assert_png, img_srcs=img_srcs)


@pytest.fixture
def rl_run(tmp_path: Path) -> Path:
    run = tmp_path / "grpo"
    write_jsonl(run / "metrics.jsonl", rl_rows())
    return run


@pytest.fixture
def sft_run(tmp_path: Path) -> Path:
    run = tmp_path / "sft"
    write_jsonl(run / "metrics.jsonl", sft_rows())
    return run


@pytest.fixture(scope="module")
def rl_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """HTML path of a report written once per module for a fresh RL run."""
    run = tmp_path_factory.mktemp("rl") / "grpo"
    write_jsonl(run / "metrics.jsonl", rl_rows())
    return write_report(run)


@pytest.fixture(scope="module")
def pipeline_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """HTML path of a report written once per module for a fresh pipeline."""
    return write_report(make_pipeline(tmp_path_factory.mktemp("pipe")))


@pytest.fixture
def pipeline_dir(tmp_path: Path) -> Path:
    return make_pipeline(tmp_path)


def make_pipeline(root: Path) -> Path:
    pipe = root / "pipeline"
    write_jsonl(pipe / "cpt" / "metrics.jsonl", sft_rows(12))
    write_jsonl(pipe / "sft" / "metrics.jsonl", sft_rows(30))
    write_jsonl(pipe / "grpo" / "metrics.jsonl", rl_rows(20, eval_every=5))
    summary = {
        "stages": [
            {"name": "init", "accuracy": 0.05, "format_accuracy": 0.1},
            {"name": "cpt", "accuracy": 0.08, "seconds": 95.2, "run_dir": "cpt"},
            {"name": "sft", "accuracy": 0.31, "format_accuracy": 0.9,
             "seconds": 60.0, "run_dir": "sft"},
            {"name": "grpo <rl>", "accuracy": 0.45, "format_accuracy": 0.97,
             "seconds": 400.5, "run_dir": "grpo"},
        ],
        "model": "tiny-model",
        "total_seconds": 555.7,
    }
    (pipe / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    return pipe
