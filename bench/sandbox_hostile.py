"""Hostile programs through `lmpo.envs.sandbox`, each checked for effects outside the sandbox.

    .venv/bin/python bench/sandbox_hostile.py [--isolation both|auto|bubblewrap|process] [--cases a,b]

Prints a Markdown table (case | isolation used | outcome | wall time | effect outside? | processes
left) and, per isolation, what it leaves unprotected. Every program gets as arguments a marker
that names its processes, a caller-owned directory it must not write, the port of a loopback
listener it must not reach and the pid of a caller process whose environment holds a secret;
the same secret is in the caller's own environment. After each run the harness looks for files,
the secret in the output, a connection, and processes whose command line holds the marker.
tests/test_sandbox.py runs the same cases.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from lmpo.envs.sandbox import SandboxLimits, SandboxResult, run_python, sandbox_capabilities

SECRET_VAR = "LMPO_HOSTILE_SECRET"
_QUICK = SandboxLimits(wall_s=0.8)
_STARTED = "print('started', flush=True)\n"  # so a timeout is seen to stop the loop, not the start


@dataclass(frozen=True)
class Case:
    name: str
    code: str
    expect: str
    """The outcome it must have, as `SandboxResult.outcome()` says it, or a prefix of it."""
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    needs: str = ""
    """'bubblewrap' when only bubblewrap protects against it; 'separate_uid' when the fallback does
    only if the caller is root (a uid of the sandbox's own)."""
    unsafe_unprotected: bool = False
    """Not run at all without the protection it needs (it would harm the machine)."""
    stdout_has: str = ""
    stderr_has: str = ""
    reports_reaching: str = ""
    """A line of the program's output that starts so says it reached outside where the harness
    cannot see it (a remote host)."""


CASES = [
    Case("infinite loop", _STARTED + "while True:\n    pass\n", "timed out", _QUICK, stdout_has="started"),
    Case("C-level loop: sum(range(10**12))", _STARTED + "sum(range(10**12))\n", "timed out", _QUICK,
         stdout_has="started"),
    Case("regex catastrophe", "import re\n" + _STARTED + "re.match(r'(a+)+$', 'a' * 64 + '!')\n", "timed out",
         _QUICK, stdout_has="started"),
    Case("fork bomb", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
         "timed out", SandboxLimits(wall_s=0.8, processes=16), needs="separate_uid"),
    Case("4 GB allocation", "buffer = bytearray(4 << 30)\n", "exit 1", stderr_has="MemoryError"),
    Case("100 MB of output", "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(100):\n    sys.stdout.write(chunk)\n",
         "killed: output", SandboxLimits(output_bytes=64 << 10)),
    Case("write outside its directory (caller's dir)", """\
import os, sys
for path in (os.path.join(sys.argv[2], "pwned"), "/root/pwned", "/etc/pwned", "/usr/pwned"):
    try:
        with open(path, "w") as f:
            f.write("pwned")
        print("wrote", path)
    except OSError as error:
        print("refused", path, error)
""", "exit 0", needs="separate_uid"),
    Case("write outside its directory (/tmp, /var/tmp, /dev/shm)", """\
import os, sys
for directory in ("/tmp", "/var/tmp", "/dev/shm"):
    try:
        with open(os.path.join(directory, sys.argv[1]), "w") as f:
            f.write("pwned")
        print("wrote", directory)
    except OSError as error:
        print("refused", directory, error)
""", "exit 0", needs="bubblewrap"),
    Case("fill the disk with many files", """\
import os
written = 0
try:
    while True:
        with open(f"f{written}", "wb") as f:
            f.write(b"x" * (1 << 20))
        written += 1
except OSError as error:
    print("stopped after", written, "MiB:", error)
""", "exit 0", SandboxLimits(file_mb=8), needs="bubblewrap", unsafe_unprotected=True, stdout_has="stopped after"),
    Case("read the parent's environment secrets", """\
import os, sys
print(dict(os.environ))
for pid in ["self", str(os.getppid()), "1", sys.argv[4]] + os.listdir("/proc"):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            print(pid, f.read().replace(b"\\0", b" ").decode(errors="replace"))
    except OSError:
        pass
os.system("cat /proc/*/environ 2>/dev/null | tr '\\\\0' '\\\\n'")
""", "exit 0", needs="separate_uid"),
    Case("open a network connection", """\
import socket, sys
for address in (("127.0.0.1", int(sys.argv[3])), ("1.1.1.1", 53), ("8.8.8.8", 443)):
    try:
        socket.create_connection(address, timeout=1).close()
        print("connected", address)
    except OSError as error:
        print("refused", address, error)
""", "exit 0", needs="bubblewrap", reports_reaching="connected"),
    Case("os.system and execv", """\
import os, sys
marker, outside = sys.argv[1], sys.argv[2]
os.system(f"echo pwned > {outside}/system.txt; env > {outside}/env.txt")
os.execv("/bin/sh", ["sh", "-c", f"touch {outside}/execv.txt; echo shell ran {marker}"])
""", "exit 0", needs="separate_uid", stdout_has="shell ran"),
    Case("ignore SIGTERM/SIGINT/SIGHUP", """\
import signal
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1):
    signal.signal(sig, signal.SIG_IGN)
print("started", flush=True)
while True:
    pass
""", "timed out", _QUICK, stdout_has="started"),
    Case("orphans: double-fork daemon that outlives it", """\
import os, signal, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        for fd in (0, 1, 2):
            os.close(fd)
        time.sleep(1000)
    os._exit(0)
time.sleep(0.2)
print("parent exits, daemon lives on")
""", "exit 0", stdout_has="parent exits", needs="separate_uid"),
    Case("CPU-time limit", _STARTED + "while True:\n    pass\n", "killed: cpu time", SandboxLimits(wall_s=5.0, cpu_s=1),
         stdout_has="started"),
]


@dataclass
class Report:
    case: Case
    isolation: str
    result: SandboxResult | None = None
    effects: list[str] = field(default_factory=list)
    leftovers: list[int] = field(default_factory=list)
    skipped: str = ""

    @property
    def expected(self) -> bool:
        """The outcome is what the case expects (classified correctly)."""
        r = self.result
        return (r is not None and r.outcome().startswith(self.case.expect) and self.case.stdout_has in r.stdout
                and self.case.stderr_has in r.stderr)


def processes_with(marker: str) -> list[int]:
    """Processes (not zombies) whose command line contains `marker`."""
    found, needle = [], marker.encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            if needle in Path(f"/proc/{name}/cmdline").read_bytes():
                found.append(int(name))
        except OSError:
            continue
    return found


def guaranteed(case: Case, isolation: str) -> str:
    """Why `isolation` does not protect against `case` here ('' when it does)."""
    caps = sandbox_capabilities(isolation)
    if case.needs == "bubblewrap" and caps.isolation != "bubblewrap":
        return "only bubblewrap protects against this"
    if case.needs == "separate_uid" and caps.isolation != "bubblewrap" and not caps.separate_uid:
        return "without bubblewrap only a root caller (a uid of the sandbox's own) protects against this"
    return ""


def run_case(case: Case, isolation: str) -> Report:
    report = Report(case, sandbox_capabilities(isolation).isolation)
    marker = f"lmpo-hostile-{secrets.token_hex(8)}"
    secret = secrets.token_hex(16)
    outside = Path(tempfile.mkdtemp(prefix="lmpo-hostile-outside-"))
    outside.chmod(0o755)
    listener = socket.create_server(("127.0.0.1", 0), backlog=16)
    listener.setblocking(False)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                              env={SECRET_VAR: secret, "PATH": os.environ.get("PATH", "")})
    os.environ[SECRET_VAR] = secret
    try:
        report.result = run_python(case.code, args=[marker, str(outside), str(listener.getsockname()[1]),
                                                    str(holder.pid)], limits=case.limits, isolation=isolation)
        report.leftovers = processes_with(marker)
        written = sorted(path.name for path in outside.iterdir())
        if written:
            report.effects.append(f"wrote {', '.join(written)} in the caller's dir")
        for directory in ("/tmp", "/var/tmp", "/dev/shm"):
            for path in Path(directory).glob(f"{marker}*"):
                report.effects.append(f"wrote {path}")
                path.unlink()
        if secret in report.result.stdout + report.result.stderr:
            report.effects.append("read the caller's secret")
        try:
            listener.accept()[0].close()
            report.effects.append("connected to the caller's loopback listener")
        except BlockingIOError:
            pass
        if case.reports_reaching:
            report.effects += [f"program reports: {line}" for line in report.result.stdout.splitlines()
                               if line.startswith(case.reports_reaching) and "127.0.0.1" not in line]
    finally:
        del os.environ[SECRET_VAR]
        for pid in processes_with(marker):  # the harness never leaves them behind, whatever happened
            os.kill(pid, signal.SIGKILL)
        holder.kill()
        holder.wait()
        listener.close()
        shutil.rmtree(outside, ignore_errors=True)
    return report


def _row(report: Report) -> str:
    r = report.result
    if r is None:
        return f"| {report.case.name} | {report.isolation} | skipped: {report.skipped} | - | - | - |"
    outcome = r.outcome() + (", truncated" if r.stdout_truncated or r.stderr_truncated else "")
    if not report.expected:
        outcome += f" (expected {report.case.expect})"
    effect = "; ".join(report.effects) or "no"
    if report.skipped:
        effect += f" — not guaranteed: {report.skipped}"
    return (f"| {report.case.name} | {r.isolation} | {outcome} | {r.wall_s:.2f} s | {effect} | "
            f"{len(report.leftovers)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--isolation", default="both", choices=["both", "auto", "bubblewrap", "process"])
    parser.add_argument("--cases", default="", help="comma-separated substrings of case names (default: all)")
    args = parser.parse_args()
    isolations = ["bubblewrap", "process"] if args.isolation == "both" else [args.isolation]
    if args.isolation == "both" and sandbox_capabilities().isolation != "bubblewrap":
        isolations = ["process"]
    wanted = [c for c in CASES if not args.cases or any(s.strip() in c.name for s in args.cases.split(","))]
    print("| case | isolation used | outcome | wall time | effect outside? | processes left |")
    print("|---|---|---|---|---|---|")
    failures = 0
    for isolation in isolations:
        for case in wanted:
            why = guaranteed(case, isolation)
            if why and case.unsafe_unprotected:
                report = Report(case, sandbox_capabilities(isolation).isolation, skipped=why)
            else:
                report = run_case(case, isolation)
                report.skipped = why
                failures += not why and (bool(report.effects or report.leftovers) or not report.expected)
            print(_row(report), flush=True)
    for isolation in isolations:
        caps = sandbox_capabilities(isolation)
        print(f"\n{caps.isolation} (separate uid: {caps.separate_uid}) leaves unprotected:")
        for item in caps.unprotected:
            print(f"- {item}")
        if caps.note:
            print(f"({caps.note})")
    print(f"\n{failures} guaranteed case(s) failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
