"""A sandbox for model-written code: a separate process with a wall-clock deadline, resource
limits, no network, an empty working directory, a scrubbed environment and bounded output —
under bubblewrap where it works, else a plain process with what that can enforce
(`sandbox_capabilities()` says which, and what is left unprotected; docs/sandbox.md explains)."""

from lmpo.envs.sandbox.limits import (
    SandboxCapabilities,
    SandboxError,
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
)
from lmpo.envs.sandbox.run import run_command, run_python, sandbox_capabilities

__all__ = ["SandboxCapabilities", "SandboxError", "SandboxLimits", "SandboxResult", "SandboxUnavailable",
           "run_command", "run_python", "sandbox_capabilities"]
