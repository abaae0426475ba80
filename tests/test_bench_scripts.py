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
