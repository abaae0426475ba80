"""SIGTERM inside `stop_at_next_step`: a request the trainer honours after its step (the trainers'
own behaviour is tested in test_resume.py); a second SIGTERM, or none of this, kills as usual."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from lmpo.trainers.preemption import stop_at_next_step, stop_requested


def test_sigterm_only_marks_the_request_and_the_handler_is_restored_after():
    before = signal.getsignal(signal.SIGTERM)
    with stop_at_next_step():
        assert not stop_requested()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop_requested()  # and this process is still here
    assert not stop_requested() and signal.getsignal(signal.SIGTERM) is before


def test_not_enabled_leaves_sigterm_alone():
    before = signal.getsignal(signal.SIGTERM)
    with stop_at_next_step(enabled=False):
        assert signal.getsignal(signal.SIGTERM) is before


def test_a_second_sigterm_kills_at_once():
    code = ("import os, signal, time\n"
            "from lmpo.trainers.preemption import stop_at_next_step\n"
            "with stop_at_next_step():\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    print('asked once', flush=True)\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    time.sleep(30)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGTERM and done.stdout == "asked once\n", done


def test_ctrl_c_while_the_parser_is_built_is_one_line_not_a_traceback(monkeypatch, capsys):
    """Building the parser imports torch (about 4 s): a Ctrl-C there gave a raw KeyboardInterrupt
    traceback (in enum.py, dataclasses.py), not `lmpo: interrupted`."""
    import lmpo.cli.main as cli

    def interrupted(command=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "make_parser", interrupted)
    assert cli.main(["train", "sft"]) == 130
    assert capsys.readouterr().err == "lmpo: interrupted\n"
