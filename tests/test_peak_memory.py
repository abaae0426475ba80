"""The peak memory a run reports is its own process's. It was `ru_maxrss`, which Linux carries
from a parent into a child across fork and exec: `lmpo compare` trains a seed's SFT start
in-process, then starts each method's run as a child, and every run of seeds 1 and 2 reported
the start's training peak (1,005.8 and 1,150.2 MB for all four methods alike)."""

import json
import subprocess
import sys

import pytest

CHILD = ("import resource; from lmpo.models import peak_rss_mb; "
         "print(peak_rss_mb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux's")
def test_a_child_process_reports_its_own_peak_not_its_parents(tmp_path):
    held = bytearray(1200 * 2**20)  # the parent's peak: 1.2 GiB, touched
    held[::4096] = b"\1" * len(held[::4096])
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True).stdout
    run = [sys.executable, "-m", "lmpo", "train", "grpo", "--model", "tiny", "--steps", "1", "--prompts_per_step", "2", "--group_size",
           "2", "--eval_problems", "0", "--threads", "1", "--out", str(tmp_path / "run")]
    subprocess.run(run, capture_output=True, text=True, check=True)
    del held
    own, inherited = map(float, out.split())
    assert inherited > 1200  # what the child's ru_maxrss says: its parent's peak
    assert 10 < own < 1000  # torch and lmpo imported, nothing more
    reported = json.loads((tmp_path / "run" / "result.json").read_text())["peak_rss_mb"]
    assert 10 < reported < 1100  # a 1M-parameter model's run, not the parent's 1.2 GiB
