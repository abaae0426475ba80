"""What isolation this machine allows, and the pieces each kind needs: bubblewrap's command line,
a uid of the sandbox's own, an interpreter that uid can run, and killing whatever is left."""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

from lmpo.envs.sandbox.limits import Isolation, SandboxCapabilities, SandboxUnavailable

IsolationChoice = Literal["auto", "bubblewrap", "process"]
PATH = "/usr/local/bin:/usr/bin:/bin"
WORKDIR = "/sandbox"  # the program's working directory under bubblewrap
INPUTS = "/sandbox-inputs"  # read-only copy source of its files under bubblewrap

# Fresh uids come from a range that no distribution, user or subuid allocation uses: such a uid
# owns no file and no other process, so kill(-1) as that uid reaches the sandbox's processes only.
_UID_BASE, _UID_SPAN = 1_900_000_000, 100_000_000
_NOBODY = 65534  # stands for any unprivileged uid when checking what such a uid can run
_SYSTEM = ("/usr", "/etc")
_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")

_KILL_ALL = """\
import os, signal, sys
uid = int(sys.argv[1])
if uid == 0 or os.getresuid() != (uid, uid, uid):
    sys.exit(f"refusing kill(-1) with uids {os.getresuid()}")
try:
    os.kill(-1, signal.SIGKILL)
except ProcessLookupError:
    pass
"""


def separate_uid() -> bool:
    """Root runs each program as a fresh uid; anyone else can only use their own."""
    return os.geteuid() == 0


def fresh_uid() -> int:
    while True:
        uid = _UID_BASE + secrets.randbelow(_UID_SPAN)
        if not processes_of_uid(uid):
            return uid


def _namespace_flags() -> list[str]:
    if separate_uid():
        # Root's bwrap needs no user namespace; the waiter keeps CAP_SETUID/SETGID to drop to the
        # fresh uid, and bubblewrap sets no_new_privs so nothing can climb back.
        return ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    return ["--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(_NOBODY), "--gid", str(_NOBODY)]


@functools.cache
def bubblewrap() -> tuple[str | None, str]:
    """(path of a bwrap that works here, or None; why not)."""
    path = shutil.which("bwrap") or shutil.which("bwrap", path=PATH)
    if path is None:
        return None, "bubblewrap (bwrap) is not installed; scripts/install-sandbox.sh installs it"
    probe = [path, *_namespace_flags(), "--ro-bind", "/", "/", "--proc", "/proc", "--", "/bin/true"]
    try:
        done = subprocess.run(probe, stdin=subprocess.DEVNULL, capture_output=True, timeout=30,
                              env={"PATH": PATH}, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, f"{path} cannot run here: {error}"
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip()
        return None, f"{path} cannot create its namespaces here ({why}); user namespaces may be disabled"
    return path, ""


def _runs_as_nobody(python: str) -> bool:
    try:
        done = subprocess.run([python, "-I", "-S", "-c", "import ctypes, json, resource, shutil"],
                              user=_NOBODY, group=_NOBODY, extra_groups=[], cwd="/", env={"PATH": PATH},
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@functools.cache
def interpreter(for_other_uid: bool) -> str:
    """The Python that runs the waiter and `run_python`'s code: this one when the sandbox can see
    it, else (another uid without bubblewrap's binds) a system Python of the same version."""
    own = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    if not for_other_uid:
        return own
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (own, f"/usr/bin/{version}", f"/usr/local/bin/{version}", "/usr/bin/python3",
                      "/usr/local/bin/python3"):
        if os.path.exists(candidate) and _runs_as_nobody(candidate):
            return os.path.realpath(candidate)
    raise SandboxUnavailable(f"no Python here can be run by an unprivileged uid ({own} is not readable "
                             "by other users): install bubblewrap or a system python3")


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in roots)


def bubblewrap_argv(bwrap: str, *, python: str, inputs: str | None, writable_bytes: int,
                    info_fd: int) -> list[str]:
    args = [bwrap, *_namespace_flags(), "--die-with-parent", "--new-session", "--hostname", "sandbox",
            "--info-fd", str(info_fd)]
    for path in _SYSTEM:
        if os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in _SYSTEM_LINKS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    # An interpreter outside /usr (pyenv, conda) is bound at its own path: its shared library is
    # found through an absolute rpath. Directories bwrap creates for it would be 0700 otherwise.
    bound: list[str] = []
    made: set[str] = set()
    for prefix in sorted({os.path.realpath(sys.base_prefix), os.path.dirname(python)}):
        if _under(prefix, _SYSTEM + _SYSTEM_LINKS + tuple(bound)):
            continue
        for parent in map(str, reversed(Path(prefix).parents[:-1])):
            if parent not in made:
                args += ["--perms", "0755", "--dir", parent]
                made.add(parent)
        args += ["--ro-bind", prefix, prefix]
        bound.append(prefix)
    size = str(writable_bytes)
    args += ["--proc", "/proc", "--dev", "/dev",
             "--perms", "01777", "--size", size, "--tmpfs", "/tmp",
             "--perms", "01777", "--size", size, "--tmpfs", "/dev/shm",
             "--perms", "0777", "--size", size, "--tmpfs", WORKDIR, "--chdir", WORKDIR]
    if inputs is not None:
        args += ["--ro-bind", inputs, INPUTS]
    return args


def _proc_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def processes_of_uid(uid: int) -> list[int]:
    """Live (not zombie) processes whose real, effective or saved uid is `uid`."""
    found = []
    for pid in _proc_pids():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("State", "").strip().startswith("Z"):
            continue
        if str(uid) in fields.get("Uid", "").split()[:3]:
            found.append(pid)
    return found


def kill_uid(uid: int, python: str) -> None:
    """SIGKILL every process of `uid` with one kill(-1) made as that uid: atomic against fork, and
    it reaches processes that left the process group. Never as root: that would kill the machine."""
    if uid < _UID_BASE:
        raise ValueError(f"kill_uid is for the sandbox's own uids, not {uid}")
    subprocess.run([python, "-I", "-S", "-c", _KILL_ALL, str(uid)], user=uid, group=uid, extra_groups=[],
                   cwd="/", env={"PATH": PATH}, stdin=subprocess.DEVNULL, capture_output=True, timeout=30,
                   check=True)


def kill_marked(token: str) -> int:
    """SIGKILL our processes whose environment carries `token`; returns how many there were."""
    needle, me, killed = f"\0LMPO_SANDBOX_ID={token}\0".encode(), os.getpid(), 0
    for pid in _proc_pids():
        try:
            environ = b"\0" + Path(f"/proc/{pid}/environ").read_bytes()
            if pid != me and needle in environ:
                os.kill(pid, signal.SIGKILL)
                killed += 1
        except OSError:
            continue
    return killed


def is_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def capabilities(isolation: IsolationChoice = "auto") -> SandboxCapabilities:
    """What the sandbox enforces here; `isolation` as for `run_python` ("auto" resolves it)."""
    if isolation not in ("auto", "bubblewrap", "process"):
        raise ValueError(f"isolation must be 'auto', 'bubblewrap' or 'process', not {isolation!r}")
    path, why = bubblewrap()
    if isolation == "bubblewrap" and path is None:
        raise SandboxUnavailable(why)
    chosen: Isolation = "bubblewrap" if path is not None and isolation != "process" else "process"
    own_uid = separate_uid()
    unprotected = ["the kernel itself: there is no seccomp filter, so a kernel exploit escapes",
                   "CPU time and memory are limited per process, not in total (no cgroup)"]
    if chosen == "bubblewrap":
        if own_uid:
            unprotected.append("user namespaces can be created inside (more kernel attack surface)")
    else:
        unprotected += [
            "network: connections go wherever the host's go",
            "the process table: the program sees every process and its command line",
            "disk: each file is limited, not their number or total size",
            ("the filesystem: the program reads what any user may read and writes the world-writable "
             "directories (/tmp, /var/tmp, /dev/shm)") if own_uid else
            ("the filesystem and the caller's processes: the program reads and writes whatever the caller "
             "can, reads the caller's environment through /proc and can signal the caller's processes"),
        ]
        if not own_uid:
            unprotected += [("leftover processes are found by an environment marker, which a program that "
                             "execs with a new environment escapes"),
                            "the process limit counts all of the caller's processes, so it is approximate"]
    return SandboxCapabilities(
        isolation=chosen, bubblewrap=path, separate_uid=own_uid, pid_namespace=chosen == "bubblewrap",
        network_isolated=chosen == "bubblewrap", filesystem_isolated=chosen == "bubblewrap",
        unprotected=tuple(unprotected), note=why if chosen == "process" else "")
