"""The pieces of bench/gpu_smoke.sh that run without a GPU: the model build and the summary."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smoke():
    spec = importlib.util.spec_from_file_location("gpu_smoke", ROOT / "bench" / "gpu_smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_peak_table(smoke):
    assert smoke.peak_tflops("NVIDIA H200") == 989.0
    assert smoke.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert smoke.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert smoke.peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert smoke.peak_tflops("NVIDIA A10G") == 70.0
    assert smoke.peak_tflops("cpu") is None


def test_padded_tokenizer_decodes_every_id(smoke):
    tok = smoke.smoke_tokenizer(300)
    assert len(tok) == 300
    assert tok.decode([tok.convert_tokens_to_ids("7"), 299]) == "7<x195>"
    assert tok("12=", add_special_tokens=False).input_ids == [tok.convert_tokens_to_ids(c) for c in "12="]


def test_build_and_summary(smoke, tmp_path):
    from lmpo.models import load_model_and_tokenizer

    built = smoke.build("tiny", str(tmp_path / "model"))
    model, tok = load_model_and_tokenizer(built["model_dir"])
    assert sum(p.numel() for p in model.parameters()) == built["parameters"] == smoke.count_parameters(built["model_dir"])
    run = tmp_path / "run-vllm"
    run.mkdir()
    rows = [{"step": 0, "accuracy": 0.0},  # an evaluation row: no timing
            {"step": 1, "time_step": 9.0, "time_generate": 5.0, "completion_len_mean": 10.0},
            {"step": 2, "time_step": 2.0, "time_generate": 1.0, "completion_len_mean": 20.0, "prompt_len_mean": 5.0},
            {"step": 3, "time_step": 4.0, "time_generate": 2.0, "completion_len_mean": 20.0, "prompt_len_mean": 5.0,
             "mismatch_kl": 0.001}]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (run / "result.json").write_text(json.dumps({"peak_gpu_mb": 1234.5}))
    summary = smoke.summarize(built["model_dir"], [str(run), str(tmp_path / "run-local")], batch=4,
                              device_name="NVIDIA H200")
    got = summary["vllm"]
    # step 1 is warm-up; median step time 3 s; 80 completion + 20 prompt tokens per step
    assert got["step_time_s"] == 3.0 and got["tokens_per_s"] == pytest.approx(80 / 3, abs=0.1)
    assert got["generate_tokens_per_s"] == pytest.approx(80 / 1.5, abs=0.1)
    assert got["mfu"] == pytest.approx(round(6 * built["parameters"] * 100 / 3 / 989e12, 5))
    assert got["mfu_tokens"] == "prompt+completion" and got["peak_gpu_mb"] == 1234.5 and got["mismatch_kl"] == 0.001
    assert "error" in summary["local"]
