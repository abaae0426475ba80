"""A `python` tool: the model's program runs in the sandbox (`lmpo.envs.sandbox`), and what it
printed comes back as the observation."""

from __future__ import annotations

from lmpo.envs.sandbox import SandboxLimits, SandboxResult, run_python
from lmpo.envs.tools.schema import Tool, ToolError, ToolTimeout, clip, tool

DEFAULT_LIMITS = SandboxLimits(wall_s=5.0, cpu_s=5.0, memory_mb=512, output_bytes=64 * 1024)
"""Tighter than the sandbox's own defaults: a tool call sits inside an episode's turn."""


def make_python_tool(limits: SandboxLimits | None = None, max_output_chars: int = 2000) -> Tool:
    """The `python` tool: runs `code` (standard library only) under `limits` and returns its
    stdout, and its stderr labelled when there is any, clipped to `max_output_chars`. The agent
    loop then clips every observation to the task's `max_observation_chars` (512 unless the task
    sets it): a task that wants the model to see more than 512 characters sets that too.

    A program that passes the wall-clock deadline gives a ToolTimeout (the episode ends as
    `tool_timeout`), one that the sandbox kills for a resource a ToolError with the reason; a
    program that raises is an ordinary observation (its traceback is on stderr).
    """
    limits = limits or DEFAULT_LIMITS
    if max_output_chars < 1:
        raise ValueError(f"max_output_chars must be positive, got {max_output_chars}")

    def python(code: str) -> str:
        """Run a Python program (standard library only) and return what it prints.

        Args:
            code: The complete program; print() the results you want to see.
        """
        result = run_python(code, limits=limits)
        output = _observation(result, max_output_chars)
        if result.timed_out:
            raise ToolTimeout(f"timeout: the program ran past {limits.wall_s:g} s and was killed"
                            + _partial(output))
        if result.killed_reason == "cpu_time":
            raise ToolError(f"killed: the program used more than {limits.cpu_s:g} s of CPU" + _partial(output))
        if result.killed_reason == "output":
            raise ToolError(f"killed: the program wrote far more than {limits.output_bytes} bytes of output"
                            + _partial(output))
        if result.signal is not None:
            raise ToolError(f"killed: {result.outcome()}" + _partial(output))
        if result.returncode != 0:
            output = f"{output}\n[exit code {result.returncode}]"
        return output

    return tool(python)


def _observation(result: SandboxResult, max_chars: int) -> str:
    stdout = result.stdout + ("\n…[more output discarded]" if result.stdout_truncated else "")
    stderr = result.stderr + ("\n…[more output discarded]" if result.stderr_truncated else "")
    if stderr.strip():
        text = f"{stdout.rstrip()}\nstderr:\n{stderr.rstrip()}" if stdout.strip() else f"stderr:\n{stderr.rstrip()}"
    else:
        text = stdout.rstrip("\n") if stdout.strip() else "(no output)"
    return clip(text, max_chars)


def _partial(output: str) -> str:
    return "" if output == "(no output)" else f"; output before it stopped:\n{output}"
