"""Running one program in a fresh sandbox: set up its directory, start it under the chosen
isolation, read its output within bounds, enforce the deadline, and leave nothing behind."""

from __future__ import annotations

import json
import math
import os
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from contextlib import ExitStack, suppress
from pathlib import Path, PurePosixPath

from lmpo.envs.sandbox import isolation as iso
from lmpo.envs.sandbox.limits import (
    DEFAULT_LIMITS,
    OUTPUT_KILL_FACTOR,
    SandboxCapabilities,
    SandboxError,
    SandboxLimits,
    SandboxResult,
)

_BOOTSTRAP = (Path(__file__).parent / "bootstrap.py").read_text()
_DRAIN_S = 1.0  # after the program ends, how long output may still arrive
_CLEANUP_S = 5.0


def run_python(code: str, *, args: Sequence[str] = (), limits: SandboxLimits = DEFAULT_LIMITS,
               stdin: str = "", files: Mapping[str, str | bytes] | None = None,
               isolation: iso.IsolationChoice = "auto") -> SandboxResult:
    """Run `code` as ``main.py`` (``python -I -S -B main.py *args``: standard library only) in a
    fresh sandbox whose working directory holds `files` and nothing else."""
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, not {type(code).__name__}")
    if files and "main.py" in files:
        raise ValueError("files must not contain main.py: it holds the code")
    return _run(lambda python: [python, "-I", "-S", "-B", "main.py", *map(str, args)], limits=limits,
                stdin=stdin, files={**(files or {}), "main.py": code}, isolation=isolation)


def run_command(argv: Sequence[str], *, limits: SandboxLimits = DEFAULT_LIMITS, stdin: str = "",
                files: Mapping[str, str | bytes] | None = None,
                isolation: iso.IsolationChoice = "auto") -> SandboxResult:
    """Run `argv` in a fresh sandbox; ``argv[0]`` is looked up on the system PATH (/usr/bin, /bin)."""
    if isinstance(argv, str) or not argv:
        raise ValueError("argv must be a non-empty sequence of strings")
    program = argv[0] if os.path.isabs(argv[0]) else shutil.which(argv[0], path=iso.PATH)
    if program is None:
        raise ValueError(f"{argv[0]!r} is not on {iso.PATH}")
    return _run(lambda python: [program, *map(str, argv[1:])], limits=limits, stdin=stdin,
                files=dict(files or {}), isolation=isolation)


def sandbox_capabilities(isolation: iso.IsolationChoice = "auto") -> SandboxCapabilities:
    """What is enforced here for `isolation` (see `SandboxCapabilities`)."""
    return iso.capabilities(isolation)


def _write_inputs(root: Path, files: Mapping[str, str | bytes]) -> None:
    for name, content in files.items():
        relative = PurePosixPath(name)
        if not name or relative.is_absolute() or ".." in relative.parts or name.endswith("/"):
            raise ValueError(f"file names must be relative paths inside the work dir, not {name!r}")
        if not isinstance(content, (str, bytes)):
            raise TypeError(f"files[{name!r}] must be str or bytes")
        path = root.joinpath(*relative.parts)
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        path.chmod(0o644)


def _rlimits(limits: SandboxLimits, *, own_uid: bool, bubblewrap: bool) -> dict[str, tuple[int, int]]:
    if own_uid:
        processes = limits.processes  # the waiter runs as root and is not counted
    elif bubblewrap:
        processes = limits.processes + 2  # bwrap's init and the waiter share the program's count
    else:
        processes = limits.processes + 1 + _tasks_of_uid(os.getuid())
    cpu = math.ceil(limits.cpu_s)
    wanted = {"RLIMIT_AS": (limits.memory_mb << 20,) * 2, "RLIMIT_CPU": (cpu, cpu + 1),
              "RLIMIT_FSIZE": (limits.file_mb << 20,) * 2, "RLIMIT_NPROC": (processes,) * 2,
              "RLIMIT_NOFILE": (limits.open_files,) * 2, "RLIMIT_CORE": (0, 0)}
    # Without CAP_SYS_RESOURCE a hard limit cannot be raised: never ask above the current one.
    clamped = {}
    for name, (soft, hard) in wanted.items():
        current = resource.getrlimit(getattr(resource, name))[1]
        ceiling = hard if current == resource.RLIM_INFINITY else current
        clamped[name] = (min(soft, ceiling), min(hard, ceiling))
    return clamped


def _tasks_of_uid(uid: int) -> int:
    count = 0
    for name in os.listdir("/proc"):
        try:
            if name.isdigit() and os.stat(f"/proc/{name}").st_uid == uid:
                count += len(os.listdir(f"/proc/{name}/task"))
        except OSError:
            continue
    return count


class _Stream:
    def __init__(self, keep: int) -> None:
        self.keep, self.total, self.chunks = keep, 0, []

    def add(self, chunk: bytes) -> None:
        room = self.keep - min(self.total, self.keep)
        if room:
            self.chunks.append(chunk[:room])
        self.total += len(chunk)

    def text(self) -> str:
        return b"".join(self.chunks).decode("utf-8", errors="replace")


def _read_all(fd: int) -> bytes:
    os.set_blocking(fd, False)
    data = b""
    try:
        while chunk := os.read(fd, 65536):
            data += chunk
    except BlockingIOError:
        pass
    return data


def _run(argv_for, *, limits: SandboxLimits, stdin: str, files: dict[str, str | bytes],
         isolation: iso.IsolationChoice) -> SandboxResult:
    if not isinstance(limits, SandboxLimits):
        raise TypeError("limits must be a SandboxLimits")
    if not isinstance(stdin, str):
        raise TypeError("stdin must be a str")
    caps = iso.capabilities(isolation)
    bubblewrap = caps.isolation == "bubblewrap"
    python = iso.interpreter(for_other_uid=caps.separate_uid and not bubblewrap)
    uid = iso.fresh_uid() if caps.separate_uid else None
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="lmpo-sandbox-", ignore_cleanup_errors=True) as tmp, ExitStack() as fds:
        root = Path(tmp)
        root.chmod(0o711)  # the sandbox uid may pass through to its directories, not list them
        inputs, workdir = root / "inputs", root / "work"
        inputs.mkdir(mode=0o755)
        _write_inputs(inputs, files)
        workdir.mkdir(mode=0o700)
        if uid is not None:
            os.chown(workdir, uid, uid)
        (root / "stdin").write_text(stdin)
        cwd = iso.WORKDIR if bubblewrap else str(workdir)
        env = {"PATH": iso.PATH, "HOME": cwd, "TMPDIR": "/tmp" if bubblewrap else cwd, "LANG": "C.UTF-8",
               "LC_ALL": "C.UTF-8", "LMPO_SANDBOX_ID": token}
        open_fds: set[int] = set()
        fds.callback(_close_all, open_fds)
        status_r, status_w = _pipe(open_fds)
        info_r, info_w = _pipe(open_fds) if bubblewrap else (None, None)  # bwrap reports its init's pid here
        config = {"argv": argv_for(python), "uid": uid, "gid": uid, "status_fd": status_w,
                  "inputs": (iso.INPUTS if bubblewrap else str(inputs)) if files else None,
                  "rlimits": _rlimits(limits, own_uid=caps.separate_uid, bubblewrap=bubblewrap)}
        command = [python, "-I", "-S", "-c", _BOOTSTRAP, json.dumps(config)]
        if bubblewrap:
            command = [*iso.bubblewrap_argv(caps.bubblewrap, python=python, inputs=str(inputs) if files else None,
                                            writable_bytes=limits.file_mb << 20, info_fd=info_w), "--", *command]
        with open(root / "stdin", "rb") as stdin_file:
            proc = subprocess.Popen(command, stdin=stdin_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    cwd="/" if bubblewrap else cwd, env=env, start_new_session=True,
                                    pass_fds=[fd for fd in (status_w, info_w) if fd is not None])
        fds.callback(_reap, proc)
        _close_all(open_fds, {status_w, info_w})  # only the sandbox holds the write ends now

        def kill_everything() -> None:
            if proc.returncode is None:  # once reaped, its pid (the group's id) may belong to another
                with suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            if bubblewrap:
                return  # killing bwrap kills its PID namespace's init, which takes everything with it
            if uid is not None:
                if iso.processes_of_uid(uid):
                    iso.kill_uid(uid, python)
            else:
                iso.kill_marked(token)

        try:
            outcome = _supervise(proc, limits, kill_everything)
        except BaseException:
            kill_everything()
            raise
        init_pid = _init_pid(_read_all(info_r)) if info_r is not None else None
        _wait_until_gone(bubblewrap=bubblewrap, uid=uid, token=token, init_pid=init_pid, kill=kill_everything)
        status = _status_lines(_read_all(status_r))
    return _result(proc, limits, outcome, status, caps.isolation)


def _pipe(open_fds: set[int]) -> tuple[int, int]:
    read_end, write_end = os.pipe()
    open_fds.update((read_end, write_end))
    return read_end, write_end


def _close_all(open_fds: set[int], which: set[int | None] | None = None) -> None:
    for fd in list(open_fds if which is None else open_fds & which):
        os.close(fd)
        open_fds.discard(fd)


def _reap(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    proc.stdout.close()
    proc.stderr.close()


def _status_lines(data: bytes) -> list[dict]:
    lines = []
    for line in data.decode(errors="replace").splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            continue
    return [line for line in lines if isinstance(line, dict)]


def _supervise(proc: subprocess.Popen, limits: SandboxLimits, kill_everything):
    """Read both streams until they close, killing at the deadline or on too much output.
    Returns (stdout, stderr, wall_s, killed_reason)."""
    start = time.monotonic()
    deadline = start + limits.wall_s
    streams = {proc.stdout.fileno(): _Stream(limits.output_bytes), proc.stderr.fileno(): _Stream(limits.output_bytes)}
    selector = selectors.DefaultSelector()
    for fd in streams:
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ)
    try:  # readable when the process ends, so its end is seen at once rather than polled
        exit_fd = os.pidfd_open(proc.pid)
        selector.register(exit_fd, selectors.EVENT_READ)
    except (AttributeError, OSError):
        exit_fd = None
    reason, ended_at, killed_at = None, None, None
    try:
        while True:
            now = time.monotonic()
            if reason is None and now >= deadline:
                reason, killed_at = "wall_time", now
                kill_everything()
            if ended_at is None and proc.poll() is not None:
                ended_at = now
                kill_everything()  # whatever the program left running
            streams_open = any(fd in selector.get_map() for fd in streams)
            if ended_at is not None and (not streams_open or now - ended_at > _DRAIN_S):
                break
            if killed_at is not None and now - killed_at > _CLEANUP_S:
                break  # SIGKILLed yet not ended (uninterruptible sleep): stop waiting for it here
            if ended_at is not None:
                timeout = ended_at + _DRAIN_S - now
            else:  # a program that closed its output still runs until it ends or its deadline
                timeout = deadline - now if reason is None else _CLEANUP_S
                if exit_fd is None:
                    timeout = min(timeout, 0.05)
            for key, _ in selector.select(max(timeout, 0.0)):
                if key.fd == exit_fd:
                    selector.unregister(exit_fd)
                    continue
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                stream = streams[key.fd]
                stream.add(chunk)
                if reason is None and stream.total > OUTPUT_KILL_FACTOR * limits.output_bytes:
                    reason, killed_at = "output", time.monotonic()
                    kill_everything()
    finally:
        selector.close()
        if exit_fd is not None:
            os.close(exit_fd)
    wall_s = (ended_at if ended_at is not None else time.monotonic()) - start
    return streams[proc.stdout.fileno()], streams[proc.stderr.fileno()], wall_s, reason


def _wait_until_gone(*, bubblewrap: bool, uid: int | None, token: str, init_pid: int | None, kill) -> None:
    """Return only when no process of the sandbox is left, so a caller that checks finds none."""
    if bubblewrap:
        # bwrap exits as soon as its init reports the program's status; the kernel then kills the
        # rest of the PID namespace, and its init becomes a zombie (or is reaped) only when all are gone.
        done = init_pid is None or iso.wait_for(lambda: iso.is_gone(init_pid), _CLEANUP_S)
    elif uid is not None:
        def none_left() -> bool:
            if not iso.processes_of_uid(uid):
                return True
            kill()
            return False

        done = iso.wait_for(none_left, _CLEANUP_S)
    else:
        done = iso.wait_for(lambda: iso.kill_marked(token) == 0, _CLEANUP_S)
    if not done:
        warnings.warn("the sandbox could not confirm that all of its processes ended", RuntimeWarning, stacklevel=3)


def _init_pid(info: bytes) -> int | None:
    try:
        return int(json.loads(info)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


def _result(proc: subprocess.Popen, limits: SandboxLimits, outcome, status: list[dict], isolation) -> SandboxResult:
    stdout, stderr, wall_s, reason = outcome
    errors = [doc["setup_error"] for doc in status if "setup_error" in doc]
    if errors:
        raise SandboxError(f"the sandbox could not start the program: {errors[0]}")
    ended = next((doc for doc in status if "cpu_s" in doc), None)
    returncode, sig, cpu_s = None, None, None
    if reason is not None:
        sig = signal.SIGKILL
    elif ended is not None:
        returncode, sig, cpu_s = ended.get("exitcode"), ended.get("signal"), ended["cpu_s"]
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_s >= math.ceil(limits.cpu_s)):
            reason = "cpu_time"
    elif stderr.text().startswith("bwrap:"):
        raise SandboxError(f"bubblewrap failed: {stderr.text().strip()}")
    else:  # the program killed its own waiter: only the outer exit status is left
        code = proc.returncode
        returncode, sig = (None, -code) if code < 0 else (None, code - 128) if code > 128 else (code, None)
    return SandboxResult(
        returncode=returncode, signal=int(sig) if sig is not None else None, stdout=stdout.text(),
        stderr=stderr.text(), stdout_truncated=stdout.total > limits.output_bytes,
        stderr_truncated=stderr.total > limits.output_bytes, timed_out=reason == "wall_time",
        killed_reason=reason, wall_s=wall_s, cpu_s=cpu_s, isolation=isolation)
