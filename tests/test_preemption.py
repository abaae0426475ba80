"""SIGTERM inside `stop_at_next_step`: a request the trainer honours after its step (the trainers'
own behaviour is tested in test_resume.py); a second SIGTERM, or none of this, kills as usual."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

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


def test_the_resume_hint_of_a_torchrun_run_names_torchrun(monkeypatch, tmp_path):
    """A checkpoint of two processes resumes only with two: the hint after Ctrl-C said plain
    `lmpo train grpo --resume DIR`, which then refused with "written by 2 processes"."""
    from lmpo.cli.train import _resume_hint

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert "`torchrun --nproc_per_node 2 -m lmpo train grpo --resume" in _resume_hint("grpo", tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert "`lmpo train grpo --resume" in _resume_hint("grpo", tmp_path)


@pytest.mark.parametrize("stage", ["grpo", "rft", "ppo"])
def test_resume_of_a_missing_rl_directory_says_so(stage, tmp_path, capsys):
    from lmpo.cli.main import main

    assert main(["train", stage, "--resume", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.strip() == f"lmpo: error: --resume {tmp_path / 'nope'}: no such directory"


STUCK = ("import os, signal, time\n"
         "from lmpo.envs.user_calls import inside\n"
         "from lmpo.trainers import preemption\n"
         "preemption.STUCK_GRACE_S = 0.5\n"
         "try:\n"
         "    with preemption.stop_at_next_step():\n"
         "        with inside(lambda: 'MyEnv.step of episode 2'):\n"
         "            os.kill(os.getpid(), signal.SIGTERM)\n"
         "            while True:\n"
         "                {wait}\n"
         "except preemption.Terminated:\n"
         "    print('unwound', flush=True)\n")


def test_sigterm_stops_a_run_whose_step_is_stuck_in_user_code():
    """An environment's step (a grader) that never returns: the first SIGTERM did nothing, as
    the run waited for the step to end; only a second one killed it, with no word."""
    done = subprocess.run([sys.executable, "-c", STUCK.format(wait="time.sleep(1)")], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0 and done.stdout == "unwound\n", done
    assert done.stderr == ("lmpo: SIGTERM: MyEnv.step of episode 2 has not returned 0.5 s after the signal; the run "
                           "stops without finishing its step\n")


def test_user_code_that_does_not_give_way_ends_the_process():
    wait = "try: time.sleep(1)\n                except BaseException: pass"  # swallows the interruption
    done = subprocess.run([sys.executable, "-c", STUCK.format(wait=wait)], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 143 and done.stdout == "", done
    assert done.stderr.splitlines()[-1] == ("lmpo: SIGTERM: MyEnv.step of episode 2 did not give way to the "
                                            "interruption either; the process ends (exit 143)")
