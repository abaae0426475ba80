"""A multi-turn environment over typed tools: the model's turn is parsed into tool calls, a
final answer, or a parse error; calls are carried out and their results come back as `tool`
messages. Every failure (malformed call, unknown tool, bad arguments, a tool's own refusal) goes
back to the model as an error observation and is counted; the loop ends the episode only after
`max_parse_errors` of them. A tool that raised something other than ToolError is also listed
in the step's `info["tool_crashes"]`: it may be the tool's bug, which the trainer reports.
`info["tool_calls"]` counts the calls that reached a tool (it returned, refused or raised), not
those to an unknown tool or with arguments that do not fit its parameters. A tool that
overruns its time limit ends the episode as `tool_timeout` (an infrastructure failure,
excluded from training by default): the tool said so by raising ToolTimeout, or its function
raised Python's TimeoutError. What a tool returns, or a refusal worded `timeout ...`, is an
observation like any other."""

from __future__ import annotations

from typing import Callable, Sequence

from lmpo.envs.base import Problem
from lmpo.envs.env import TOOL_TIMEOUT, Step
from lmpo.envs.parsing import ToolCallFormat, execute_call
from lmpo.envs.tools import Tool, ToolTimeout


class ToolEnv:
    def __init__(self, opening: Callable[[Problem], list[dict]], tools_for: Callable[[Problem], Sequence[Tool]],
                 fmt: ToolCallFormat, call_reward: float | None = None):
        """`opening(problem)`: the episode's first messages; `tools_for(problem)`: this episode's
        tools (an episode may get its own database, say); `call_reward`: a process reward for
        each turn whose calls all succeeded (None: no per-turn reward)."""
        self.opening, self.tools_for, self.fmt, self.call_reward = opening, tools_for, fmt, call_reward
        self.tools: dict[str, Tool] = {}

    def reset(self, problem: Problem) -> list[dict]:
        self.tools = {t.name: t for t in self.tools_for(problem)}
        return self.opening(problem)

    def step(self, action_text: str) -> Step:
        parsed = self.fmt.parse(action_text)
        if parsed.error:
            return Step(f"error: {parsed.error}", info={"parse_error": True})
        if not parsed.calls:
            return Step(done=True, info={"answer": parsed.answer if parsed.answer is not None else action_text})
        observations, all_ok, crashes, ran = [], True, [], []
        for call in parsed.calls:
            try:
                text, ok = execute_call(call, self.tools, crashes, ran)
            except ToolTimeout as error:
                return Step(done=True, info={"termination": TOOL_TIMEOUT, "tool_calls": len(ran),
                                             "error": f"{call.name}: {error}"})
            observations.append({"role": "tool", "content": text})
            all_ok = all_ok and ok
        reward = self.call_reward if (self.call_reward is not None and all_ok) else None
        info = {"tool_calls": len(ran), "parse_error": not all_ok}
        return Step(observations, reward=reward, info={**info, "tool_crashes": crashes} if crashes else info)
