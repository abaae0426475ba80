"""One after-sales episode: the ticket, this episode's own database copy, the tools, the
guardrail, the verifier at the end, and the rewards.

Rewards (weights in `Rewards`): per turn, `process` for each call that makes a step of the
ticket's reference resolution for the first time (looks up its order, reads the policy its kind
needs, makes the write its ground truth calls for), minus `block_penalty` for a write the
guardrail blocked; at the end, `outcome` if the verifier accepts the final database and reply,
minus `handoff_cost` for a hand-off the ticket did not need. (The `format` reward, for an
episode closed with EOS, is the trainer's `format` reward function on `grade`.) An episode
that runs out of turns or tokens never reaches the verifier and so earns no outcome reward;
what training does with it is the termination policy's business.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from lmpo.envs.aftersales.db import episode_copy, source
from lmpo.envs.aftersales.tickets import HANDOFF
from lmpo.envs.aftersales.tools import Blocked, EpisodeTools, compact_arguments
from lmpo.envs.aftersales.verifier import Verdict, changes, verify
from lmpo.envs.base import Problem
from lmpo.envs.env import Step
from lmpo.envs.parsing import CompactFormat, ToolCallFormat
from lmpo.envs.tools import BadArguments, ToolCrash, ToolError
from lmpo.envs.tools.schema import clip

@dataclass(frozen=True)
class Rewards:
    outcome: float = 1.0
    process: float = 0.05
    block_penalty: float = 0.1
    handoff_cost: float = 0.0
    """Subtracted for a hand-off the ticket did not need (a human's time is not free). Off by
    default: measured at 0.2, GRPO stopped handing over even the tickets that need a human."""


class AftersalesEnv:
    def __init__(self, rewards: Rewards = Rewards(), fmt: ToolCallFormat | None = None, guardrail: bool = True,
                 max_observation_chars: int = 60):
        self.rewards, self.fmt, self.guardrail = rewards, fmt or CompactFormat(), guardrail
        self.max_observation_chars = max_observation_chars
        self.problem: Problem | None = None
        self.db: sqlite3.Connection | None = None
        self.tools: EpisodeTools | None = None
        self.blocks = 0
        self.verdict: Verdict | None = None
        self.unpaid: set[tuple[str, str]] = set()

    def reset(self, problem: Problem) -> list[dict]:
        if self.db is not None:
            self.db.close()
        self.problem, self.blocks, self.verdict = problem, 0, None
        self.unpaid = {tuple(c) for c in problem.meta.get("reference_calls", ())}
        self.db = episode_copy(problem.meta["db"])
        self.tools = EpisodeTools(self.db, guardrail=self.guardrail)
        self._by_name = {t.name: t for t in self.tools.tools()}
        return [{"role": "user", "content": problem.prompt}]

    def step(self, action_text: str) -> Step:
        parsed = self.fmt.parse(action_text)
        if parsed.error:
            return Step(f"error: {parsed.error}", info={"parse_error": True})
        if not parsed.calls:
            reply = parsed.answer if parsed.answer is not None else action_text
            return self._finish(reply.strip(), {"answer": reply})
        # the tally is there when zero too, so that a run without blocks reports 0, not nothing
        reward, observations, info = 0.0, [], {"tool_calls": 0, "parse_error": False,
                                                "counts": {"guardrail_blocks": 0}}
        for call in parsed.calls:
            logged = len(self.tools.log)
            text, ok, blocked = self._run(call, info)
            # each step of the reference resolution pays once, and nothing else does: no other order,
            # document, repeated or different write, or unneeded hand-off can farm the process reward
            paid = self.unpaid.intersection(self.tools.log[logged:])
            self.unpaid -= paid
            if blocked:
                self.blocks += 1
                info["counts"]["guardrail_blocks"] += 1
                reward -= self.rewards.block_penalty
            elif paid:
                reward += self.rewards.process
            info["parse_error"] = info["parse_error"] or not (ok or blocked)
            if ok and call.name == HANDOFF:
                info["handoff"] = True
                return self._finish(None, info, reward)
            observations.append({"role": "tool", "content": clip(text, self.max_observation_chars)})
        return Step(observations, reward=reward or None, info=info)

    def _run(self, call, info: dict) -> tuple[str, bool, bool]:
        """(observation, succeeded, blocked by the guardrail); a tool's crash is listed in `info`,
        and a call that reached its tool (not an unknown one, nor one with bad arguments) counted."""
        chosen = self._by_name.get(call.name)
        if chosen is None:
            return f"error: unknown tool {call.name!r}", False, False
        try:
            arguments = call.arguments if call.arguments is not None else compact_arguments(chosen, call.raw_arguments or "")
            text = chosen.call(arguments)
        except BadArguments as err:
            return f"error: {err}", False, False
        except ToolError as err:  # the tool ran and refused: a guardrail block, a crash, its own refusal
            info["tool_calls"] += 1
            if isinstance(err, Blocked):
                return str(err), False, True
            if isinstance(err, ToolCrash):
                info.setdefault("tool_crashes", []).append(err.description)
            return f"error: {err}", False, False
        info["tool_calls"] += 1
        return text, True, False

    def _finish(self, reply: str | None, info: dict, reward: float = 0.0) -> Step:
        assert self.problem is not None and self.db is not None
        meta = self.problem.meta
        expected = [tuple(change) for change in meta["expected"]]
        self.verdict = verify(expected, changes(source(meta["db"]), self.db), tuple(meta["facts"]), reply, bool(meta["handoff"]))
        info = {"counts": {"guardrail_blocks": 0}, **info, "verdict": self.verdict.correct}
        if info.get("handoff") and not meta["handoff"]:
            reward -= self.rewards.handoff_cost
        return Step(done=True, reward=reward + self.rewards.outcome * self.verdict.correct, info=info)

    def writes(self) -> list[tuple]:
        """The changes this episode made so far (for tests and people)."""
        assert self.problem is not None and self.db is not None
        return changes(source(self.problem.meta["db"]), self.db)

