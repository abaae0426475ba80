"""The sandbox for model-written code: the hostile-program suite of bench/sandbox_hostile.py under
bubblewrap and under the plain-process fallback, plus the API's own behaviour."""

import importlib.util
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from lmpo.envs.sandbox import (
    SandboxError,
    SandboxLimits,
    SandboxUnavailable,
    run_command,
    run_python,
    sandbox_capabilities,
)
from lmpo.envs.sandbox import isolation as iso


def _load_hostile():
    path = Path(__file__).parents[1] / "bench" / "sandbox_hostile.py"
    spec = importlib.util.spec_from_file_location("sandbox_hostile", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


hostile = _load_hostile()
AUTO = sandbox_capabilities()
ISOLATIONS = ["bubblewrap", "process"]


def _usable(isolation):
    if isolation == "bubblewrap" and AUTO.isolation != "bubblewrap":
        pytest.skip(f"bubblewrap is unavailable: {AUTO.note}")
    return isolation


@pytest.mark.parametrize("isolation", ISOLATIONS)
@pytest.mark.parametrize("case", hostile.CASES, ids=lambda case: case.name.split(":")[0].replace(" ", "-"))
def test_hostile_program_has_no_effect_outside_and_leaves_no_process(case, isolation):
    _usable(isolation)
    if why := hostile.guaranteed(case, isolation):
        pytest.skip(f"not guaranteed by {isolation} here: {why}")
    report = hostile.run_case(case, isolation)
    result = report.result
    assert result.isolation == isolation
    assert report.expected, (f"expected {case.expect!r}, got {result.outcome()!r}\n"
                             f"stdout: {result.stdout[-500:]}\nstderr: {result.stderr[-500:]}")
    assert report.effects == []
    assert report.leftovers == [], "processes with the program's marker outlived the sandbox"
    if result.timed_out:
        assert result.signal == signal.SIGKILL and result.returncode is None
        assert result.wall_s < case.limits.wall_s + 1.0


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_output_is_bounded_and_truncation_is_reported(isolation):
    limits = SandboxLimits(output_bytes=10_000)
    result = run_python("import sys\nprint('o' * 50_000)\nprint('e' * 20, file=sys.stderr)", limits=limits,
                        isolation=_usable(isolation))
    assert result.ok and result.stdout == "o" * 10_000 and result.stdout_truncated
    assert result.stderr == "e" * 20 + "\n" and not result.stderr_truncated


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_runs_code_with_stdin_files_and_arguments_in_a_scrubbed_environment(isolation):
    code = """\
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "stdin": sys.stdin.read(), "data": open("data/in.txt").read(),
                  "cwd_files": sorted(os.listdir(".")), "env": sorted(os.environ), "home": os.environ["HOME"]}))
sys.exit(3)
"""
    result = run_python(code, args=["a", 2], stdin="hello\n", files={"data/in.txt": "x"},
                        isolation=_usable(isolation))
    seen = json.loads(result.stdout)
    assert result.returncode == 3 and result.signal is None and not result.ok and result.killed_reason is None
    assert seen["argv"] == ["a", "2"] and seen["stdin"] == "hello\n" and seen["data"] == "x"
    assert seen["cwd_files"] == ["data", "main.py"]
    assert set(seen["env"]) <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "LMPO_SANDBOX_ID", "PWD"}
    assert seen["home"] == ("/sandbox" if isolation == "bubblewrap" else seen["home"]) != os.environ.get("HOME")


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_signals_and_limits_are_classified(isolation):
    _usable(isolation)
    killed = run_python("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)", isolation=isolation)
    assert killed.signal == signal.SIGTERM and killed.returncode is None and killed.killed_reason is None
    big = run_python("open('big', 'wb').write(b'x' * (2 << 20))", limits=SandboxLimits(file_mb=1),
                     isolation=isolation)
    # under bubblewrap the work dir's tmpfs (file_mb too) may fill before the file-size limit hits
    assert big.returncode == 1 and ("File too large" in big.stderr or "No space left" in big.stderr)


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_run_command_runs_a_system_program(isolation):
    result = run_command(["sh", "-c", "echo hi; cat; exit 4"], stdin="in", isolation=_usable(isolation))
    assert (result.returncode, result.stdout) == (4, "hi\nin")


def test_bad_input_is_refused_with_a_clear_error():
    for bad in ({"wall_s": 0}, {"cpu_s": -1}, {"processes": True}, {"output_bytes": 0}, {"wall_s": "1"},
                {"wall_s": float("inf")}, {"cpu_s": float("nan")}):
        with pytest.raises(ValueError, match="SandboxLimits"):
            SandboxLimits(**bad)
    with pytest.raises(TypeError, match="integer"):
        SandboxLimits(memory_mb=1.5)
    for name in ("../escape.txt", "/etc/passwd", "", "dir/"):
        with pytest.raises(ValueError, match="relative"):
            run_python("", files={name: "x"})
    with pytest.raises(ValueError, match=r"main\.py"):
        run_python("", files={"main.py": "x"})
    with pytest.raises(ValueError, match="isolation"):
        run_python("", isolation="docker")
    with pytest.raises(TypeError):
        run_python(b"print(1)")
    with pytest.raises(ValueError, match="argv"):
        run_command([])


def test_without_bubblewrap_auto_falls_back_and_says_what_is_missing(monkeypatch):
    monkeypatch.setattr(iso, "bubblewrap", lambda: (None, "bubblewrap (bwrap) is not installed"))
    with pytest.raises(SandboxUnavailable, match="not installed"):
        run_python("print(1)", isolation="bubblewrap")
    caps = sandbox_capabilities()
    assert caps.isolation == "process" and not caps.network_isolated and not caps.pid_namespace
    assert "not installed" in caps.note and any("network" in item for item in caps.unprotected)
    result = run_python("print(6 * 7)")
    assert result.isolation == "process" and result.stdout == "42\n"


def test_capabilities_describe_the_isolation():
    caps = sandbox_capabilities("process")
    assert caps.isolation == "process" and caps.separate_uid == (os.geteuid() == 0)
    if AUTO.isolation == "bubblewrap":
        caps = sandbox_capabilities("bubblewrap")
        assert caps.pid_namespace and caps.network_isolated and caps.filesystem_isolated and caps.bubblewrap


def test_a_sandbox_failure_is_an_error_not_a_program_result():
    # the work dir cannot hold an input larger than its tmpfs under bubblewrap
    if AUTO.isolation != "bubblewrap":
        pytest.skip(f"bubblewrap is unavailable: {AUTO.note}")
    with pytest.raises(SandboxError, match="could not start"):
        run_python("", files={"big.bin": b"x" * (2 << 20)}, limits=SandboxLimits(file_mb=1), isolation="bubblewrap")


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_open_files_are_limited_by_default(isolation):
    """RLIMIT_NOFILE is set by default: a program opening files without end gets EMFILE at the
    limit instead of pushing the host's open-file count up (issue 14)."""
    code = ("import os\nfds = []\ntry:\n    while len(fds) < 100000:\n        fds.append(os.open('/dev/null', os.O_RDONLY))\n"
            "except OSError as e:\n    print('stopped', len(fds), e.errno)\n")
    result = run_python(code, isolation=_usable(isolation))
    assert result.ok, result.stderr
    stopped, opened, err = result.stdout.split()
    assert stopped == "stopped" and int(opened) < SandboxLimits().open_files and int(err) == 24  # EMFILE
    small = run_python(code, limits=SandboxLimits(open_files=16), isolation=isolation)
    assert int(small.stdout.split()[1]) < 16
