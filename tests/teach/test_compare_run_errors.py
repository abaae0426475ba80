"""`lmpo compare` with a --device or --precision its runs cannot use, and a run that fails: one
error line, before any model is trained where it can be told beforehand."""

from __future__ import annotations

import sys

import pytest

from lmpo.cli.main import main
from lmpo.teach.compare import execute


@pytest.mark.parametrize("option, value, said", [
    ("--device", "tpu", "unknown device 'tpu'; use auto, cpu, cuda or cuda:N"),
    ("--precision", "fp8", "precision='fp8': expected one of auto, fp32, bf16"),
])
def test_a_device_or_precision_no_run_can_use_is_refused_before_the_sft_start(option, value, said, tmp_path,
                                                                              monkeypatch, capsys):
    """It was refused by the first run's process, after the seed's SFT start had been trained
    (minutes, where it was not cached), as a traceback of the comparison."""
    from lmpo.teach import compare

    monkeypatch.setattr(compare, "start_model", lambda *a: pytest.fail("the SFT start was trained"))
    argv = ["compare", "--methods", "grpo", "--seeds", "0", "--samples", "64", "--out", str(tmp_path / "cmp"),
            option, value]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("lmpo: error: compare: ") and said in err and "Traceback" not in err, err
    assert not (tmp_path / "cmp").exists()


def test_a_run_that_fails_is_an_error_line_with_its_logs_tail(start_model, tmp_path, monkeypatch, capsys):
    code = "import sys; print('step 1 went wrong'); sys.exit(3)"
    monkeypatch.setattr(execute, "child_command", lambda run_dir: [sys.executable, "-c", code])
    out = tmp_path / "cmp"
    argv = ["compare", "--methods", "grpo", "--seeds", "0", "--samples", "64", "--start", start_model,
            "--out", str(out), "--lang", "zh"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert err.startswith(f"lmpo：错误：compare：grpo（种子 0）失败，退出码 3；见 {out / 'seed0' / 'grpo' / 'log.txt'}：\n"
                          f"  step 1 went wrong"), err
