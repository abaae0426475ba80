"""The benchmark scripts stay importable as the library moves (their figures are in the README)."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parent.parent / "bench"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")))
def test_a_bench_script_imports(script, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{script[:-3]}", BENCH / script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)  # runs its imports, not its main()
    assert callable(getattr(module, "main", None)), f"bench/{script} has no main()"


def test_the_profiled_step_comes_after_the_measured_ones_and_stays_out_of_the_peak(start_model, tmp_path, monkeypatch):
    """`vs_trl.py --profile` profiles one extra lmpo step after the pairs: the measured steps run
    without the profiler (it slows a step and holds memory), and the extra step's RSS does not
    count in the side's peak."""
    import json

    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("bench_vs_trl_driver", BENCH / "vs_trl.py")
    driver = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, driver)
    spec.loader.exec_module(driver)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"ab{i}", "chosen": "cde", "rejected": "fg"}) + "\n" for i in range(40)))
    table = tmp_path / "profile.txt"
    workload = driver.Workload(name="dpo", kind="dpo", model=start_model, data=str(pairs), batch_size=4, threads=1,
                               profile=str(table))
    worker = driver.Worker("lmpo", sys.executable, workload, tmp_path)
    try:
        worker.read()
        measured = worker.step()
        assert "step_s" in measured and not table.exists()
        peak = worker.peak_rss
        worker.step(profile=True)
        assert table.read_text().startswith("step 2, ") and "after the measured pairs" in table.read_text()
        assert worker.peak_rss == peak
    finally:
        worker.close()
