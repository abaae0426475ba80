"""SIGTERM (or any error) while `lmpo compare` waits on a run stops that run's process first."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from lmpo.cli.main import main
from lmpo.teach import compare
from lmpo.teach.compare import execute
from lmpo.teach.compare.plan import CompareConfig, Method
from lmpo.trainers.preemption import Terminated, sigterm_interrupts


def _sleeping_child(monkeypatch, pid_file: Path) -> None:
    """The run's process replaced by one that writes its pid and sleeps: no training."""
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    monkeypatch.setattr(execute, "child_command", lambda run_dir: [sys.executable, "-c", code])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _sigterm_once_started(pid_file: Path) -> threading.Thread:
    def send():
        deadline = time.monotonic() + 30
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_sigterm_stops_and_waits_for_the_run(tmp_path, monkeypatch):
    pid_file = tmp_path / "child.pid"
    _sleeping_child(monkeypatch, pid_file)
    spec = execute.RunSpec(CompareConfig(methods="grpo", seeds="0", samples=64, out=str(tmp_path / "cmp")),
                           Method.parse("grpo"), 0, "start")
    _sigterm_once_started(pid_file)
    with pytest.raises(Terminated), sigterm_interrupts():
        execute.launch(spec, every_s=0.1)
    assert not _alive(int(pid_file.read_text()))  # terminated and reaped, not orphaned


def test_an_error_while_waiting_stops_the_run(tmp_path, monkeypatch):
    pid_file = tmp_path / "child.pid"
    _sleeping_child(monkeypatch, pid_file)
    spec = execute.RunSpec(CompareConfig(methods="grpo", seeds="0", samples=64, out=str(tmp_path / "cmp")),
                           Method.parse("grpo"), 0, "start")

    def follow(child, log, say, every_s):  # Ctrl-C while the run is under way
        while not pid_file.exists():
            time.sleep(0.05)
        raise KeyboardInterrupt

    monkeypatch.setattr(execute, "follow", follow)
    with pytest.raises(KeyboardInterrupt):
        execute.launch(spec)
    assert not _alive(int(pid_file.read_text()))


def test_lmpo_compare_exits_143_with_one_line_on_sigterm(tmp_path, monkeypatch, capsys):
    pid_file = tmp_path / "child.pid"
    _sleeping_child(monkeypatch, pid_file)
    monkeypatch.setattr(compare, "check_model_source", lambda name: None)
    monkeypatch.setattr(compare, "start_model", lambda cfg, seed, say: ("start", None))
    _sigterm_once_started(pid_file)
    code = main(["compare", "--methods", "grpo", "--seeds", "0", "--samples", "64", "--threads", "1",
                 "--out", str(tmp_path / "cmp")])
    assert code == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "terminated (SIGTERM)" in err[0]
    assert not _alive(int(pid_file.read_text()))
