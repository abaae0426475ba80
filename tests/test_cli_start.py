"""`lmpo --help` and the commands that read a run directory start without importing torch or
transformers: on a 2-core machine `lmpo doctor` took 11 s, nearly all of it imports, and
`lmpo --help` 10 s. The other commands' options come from config dataclasses (torch)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HEALTHY = Path(__file__).parent / "data" / "healthy_sort_pipeline"

PROBE = """
import sys
from lmpo.cli.main import main
try:
    code = main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
heavy = sorted(m for m in ("torch", "transformers") if m in sys.modules)
print("HEAVY", heavy, "CODE", code)
"""


def _heavy_after(*argv: str) -> tuple[str, int]:
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120)
    line = [l for l in done.stdout.splitlines() if l.startswith("HEAVY")][-1]
    return line.split(" CODE ")[0], int(line.split(" CODE ")[1])


@pytest.mark.parametrize("argv", [["--help"], ["doctor", "RUN"], ["trajectories", "RUN"], ["doctor", "--help"],
                                  ["report", "--bogus"], ["report", "RUN"], ["presets"], ["trian"]])
def test_starts_without_torch(argv, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(HEALTHY, run)
    heavy, code = _heavy_after(*[str(run) if a == "RUN" else a for a in argv])
    assert heavy == "HEAVY []", (argv, heavy)
    assert code in (0, 1, 2)


def test_a_training_command_still_gets_every_option():
    from lmpo.cli.main import make_parser

    for command in ("train", None):
        args = make_parser(command).parse_args(["train", "grpo", "--lr", "3e-6", "--num_iterations", "2"])
        assert (args.lr, args.num_iterations) == ("3e-6", "2")  # typed later, by the config's build
    args = make_parser("eval").parse_args(["eval", "--eval_problems", "5"])
    assert args.eval_problems == "5"


def test_a_closed_pipe_is_not_an_error(tmp_path):
    """`lmpo exercise list --lang zh | head -2` ended with `lmpo: error: [Errno 32] Broken pipe`."""
    probe = ("import sys, time; from lmpo.cli.main import main; sys.stdout.flush(); time.sleep(0.5); "
             "sys.exit(main(['presets']))")
    child = subprocess.Popen([sys.executable, "-c", probe], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    child.stdout.close()  # the reader is gone before the command writes
    _, err = child.communicate(timeout=120)
    assert b"Broken pipe" not in err and b"Traceback" not in err, err
    assert child.returncode == 141
