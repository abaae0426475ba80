"""The sandbox's vocabulary: limits, results, what the machine can enforce, errors."""

from __future__ import annotations

import math
import signal as _signal
from dataclasses import dataclass, fields
from typing import Literal

Isolation = Literal["bubblewrap", "process"]
KilledReason = Literal["wall_time", "output", "cpu_time"]


class SandboxError(RuntimeError):
    """The sandbox itself could not run the program (not: the program failed)."""


class SandboxUnavailable(SandboxError):
    """The requested isolation cannot be used on this machine."""


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 10.0
    """Wall-clock deadline. The parent SIGKILLs every sandboxed process when it passes, whatever
    the program does with signals and however long a single C call runs."""
    cpu_s: float = 10.0
    """CPU seconds per process (RLIMIT_CPU): SIGXCPU at the limit, SIGKILL one second later."""
    memory_mb: int = 1024
    """Address space per process in MiB (RLIMIT_AS); a larger allocation fails (MemoryError)."""
    file_mb: int = 64
    """Largest file the program may write, in MiB (RLIMIT_FSIZE). Under bubblewrap also the size
    of each writable directory (the work dir, /tmp, /dev/shm), so many files cannot fill a disk."""
    processes: int = 64
    """Processes and threads the program may have at once, itself included (RLIMIT_NPROC on a
    uid of its own; approximate when the caller is not root and bubblewrap is absent)."""
    open_files: int = 64
    """File descriptors each process may have open (RLIMIT_NOFILE), stdin/stdout/stderr included:
    without it, a few sandboxed programs can exhaust the host's open-file table."""
    output_bytes: int = 1 << 20
    """Bytes kept of stdout and of stderr each; more is discarded and marked truncated. A stream
    that exceeds `OUTPUT_KILL_FACTOR` times this gets the program killed."""

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"SandboxLimits.{field.name} must be a positive finite number, got {value!r}")
        for name in ("memory_mb", "file_mb", "processes", "open_files", "output_bytes"):
            if not isinstance(getattr(self, name), int):
                raise TypeError(f"SandboxLimits.{name} must be an integer, got {getattr(self, name)!r}")


OUTPUT_KILL_FACTOR = 8
DEFAULT_LIMITS = SandboxLimits()


@dataclass(frozen=True)
class SandboxResult:
    returncode: int | None
    """The program's exit status; None when a signal ended it."""
    signal: int | None
    """The signal that ended the program (SIGKILL when the sandbox killed it)."""
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    """The wall-clock deadline passed."""
    killed_reason: KilledReason | None
    """Why the program was stopped: "wall_time", "output" (far beyond `output_bytes`), "cpu_time"."""
    wall_s: float
    cpu_s: float | None
    """CPU time of the program's main process, when it could be measured."""
    isolation: Isolation

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.killed_reason is None

    def outcome(self) -> str:
        """One short phrase: 'exit 0', 'signal 9 (SIGKILL)', 'timed out', 'killed: output'."""
        if self.timed_out:
            return "timed out (SIGKILL)"
        if self.killed_reason is not None:
            return f"killed: {self.killed_reason.replace('_', ' ')}"
        if self.signal is not None:
            try:
                return f"signal {self.signal} ({_signal.Signals(self.signal).name})"
            except ValueError:
                return f"signal {self.signal}"
        return f"exit {self.returncode}"


@dataclass(frozen=True)
class SandboxCapabilities:
    """What the sandbox enforces on this machine for one isolation choice."""

    isolation: Isolation
    bubblewrap: str | None
    """Path of a bwrap that works here, or None."""
    separate_uid: bool
    """The program runs as a uid of its own (the caller is root), which makes the process limit
    exact and lets the sandbox kill everything the program started."""
    pid_namespace: bool
    network_isolated: bool
    filesystem_isolated: bool
    """The program sees a read-only system and only its own writable directories."""
    unprotected: tuple[str, ...]
    """What is not protected with this isolation, in words."""
    note: str = ""
    """Why bubblewrap is not used, when it is not."""
