"""The environment protocol: `reset(problem) -> messages`, `step(action_text) -> Step`.

An environment is one episode's world. The agent loop (`lmpo.rollout.agent_loop`) owns the
tokens; the environment sees only text: the model's turn as it was sampled (decoded once, for
the environment's eyes; the loop never re-encodes it) and returns the observation as chat
messages, which the loop renders and appends. A single-turn task is the same protocol with one
turn: `SingleTurnEnv` ends the episode at the first answer.
"""

from __future__ import annotations

import inspect
import math
import numbers
import os
import traceback
from dataclasses import dataclass, field
from typing import Callable, Protocol

from lmpo.envs.base import Problem, Task
from lmpo.envs.user_calls import ProcessExit

# Why an episode ended. Every exit of the agent loop sets exactly one of these.
ANSWERED = "answered"                  # the model gave a final answer
ENV_DONE = "env_done"                  # the environment ended the episode (e.g. a hand-off)
MAX_TURNS = "max_turns"                # the turn limit was reached before an answer
TOKEN_BUDGET = "token_budget"          # the trajectory's token budget ran out
TURN_LENGTH = "turn_length"            # a model turn hit the per-turn cap without EOS
CONTEXT_OVERFLOW = "context_overflow"  # the next observation would not fit the model's context
PARSE_ERROR_LIMIT = "parse_error_limit"  # max_parse_errors malformed turns
TOOL_TIMEOUT = "tool_timeout"          # a tool overran its time limit (infrastructure)
ENV_ERROR = "env_error"                # the environment raised, or the template broke (infrastructure)
TERMINATIONS = (ANSWERED, ENV_DONE, MAX_TURNS, TOKEN_BUDGET, TURN_LENGTH, CONTEXT_OVERFLOW, PARSE_ERROR_LIMIT,
                TOOL_TIMEOUT, ENV_ERROR)
LENGTH_ENDINGS = (MAX_TURNS, TOKEN_BUDGET, TURN_LENGTH, CONTEXT_OVERFLOW)
INFRASTRUCTURE_ENDINGS = (TOOL_TIMEOUT, ENV_ERROR)


@dataclass
class Step:
    """What the environment answers to one model turn.

    `observation`: text for one `tool` message, or a list of chat messages to append (empty
    when `done`). `reward`: this turn's reward (process reward) or None. `info` keys the loop
    reads: `answer` (the final answer text, when the turn answered), `parse_error` (the turn
    was malformed: bad call syntax, unknown tool or bad arguments), `tool_calls` (calls this
    turn that reached a tool: not those to an unknown tool or with bad arguments),
    `termination` (a reason from TERMINATIONS when `done` for another reason than an answer),
    `handoff` (the episode ended by handing over to a human), `verdict` (the
    environment's own judgement of the episode, for a task's `grade_trajectory`), `counts`
    ({name: n} tallies the loop sums over the episode, e.g. guardrail blocks)."""

    observation: str | list[dict] = ""
    reward: float | None = None
    done: bool = False
    info: dict = field(default_factory=dict)

    def messages(self) -> list[dict]:
        if isinstance(self.observation, str):
            return [{"role": "tool", "content": self.observation}] if self.observation else []
        return list(self.observation)


STEP_SHAPE = "a Step(observation: str or a list of {role, content} messages, reward: a finite number or None, " \
             "done: bool, info: dict)"


def check_step(env, step) -> Step:
    """`step` as the loop reads it, or a ValueError in one line naming the environment's class and
    what it returned: a user's environment that returns None, a tuple, a NaN reward or an unknown
    termination otherwise failed deep in the loop (`'NoneType' object has no attribute 'reward'`)
    or trained on NaN in silence."""
    where = f"{type(env).__name__}.step{defined_at(env, 'step')}"
    if not isinstance(step, Step):
        raise ValueError(f"{where} returned {type(step).__name__}; expected {STEP_SHAPE}")
    problems = []
    if not (isinstance(step.observation, str) or (isinstance(step.observation, list) and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content", ""), str)
            for m in step.observation))):
        problems.append(f"observation {type(step.observation).__name__}")
    reward = step.reward  # numpy's scalars are Reals too
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, numbers.Real)
                               or not math.isfinite(reward)):
        problems.append(f"reward {reward!r}")
    if not (isinstance(step.done, bool) or type(step.done).__name__ == "bool_"):  # numpy's bool too
        problems.append(f"done {_short(step.done)}")  # done="no" ended the episode: a non-empty string is true
    if not isinstance(step.info, dict):
        problems.append(f"info {type(step.info).__name__}")
    else:
        problems += _info_problems(step)
    if problems:
        raise ValueError(f"{where} returned a Step with {'; '.join(problems)}; expected {STEP_SHAPE}")
    return step


def _info_problems(step: Step) -> list[str]:
    """What is wrong with the `info` keys the loop reads: a `tool_calls` of "many" or None, `counts`
    as a list, stopped the run with `invalid literal for int()` or a traceback from the loop, and
    `tool_crashes` as a string was kept letter by letter."""
    info, problems = step.info, []
    termination = info.get("termination")
    if termination not in (None, "", *TERMINATIONS):
        problems.append(f"info['termination'] {termination!r} (one of {', '.join(TERMINATIONS)})")
    elif termination and not step.done:
        problems.append(f"info['termination'] {termination!r} without done=True (the episode would go on)")
    calls = info.get("tool_calls", 0)
    if isinstance(calls, bool) or not isinstance(calls, numbers.Integral) or calls < 0:
        problems.append(f"info['tool_calls'] {calls!r} (a count: an int of 0 or more)")
    counts = info.get("counts", {})
    if not isinstance(counts, dict) or not all(isinstance(k, str) and isinstance(v, numbers.Integral)
                                               and not isinstance(v, bool) for k, v in counts.items()):
        problems.append(f"info['counts'] {_short(counts)} (a dict of name: int)")
    crashes = info.get("tool_crashes", [])
    if not isinstance(crashes, list) or not all(isinstance(c, str) for c in crashes):
        problems.append(f"info['tool_crashes'] {_short(crashes)} (a list of str)")
    return problems


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_opening(env, messages) -> list[dict]:
    """What `reset` returned, as a list of {role, content} messages, or a ValueError naming the class."""
    if not isinstance(messages, (list, tuple)) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages):
        raise ValueError(f"{type(env).__name__}.reset{defined_at(env, 'reset')} returned {type(messages).__name__}"
                         f"{' with other items than messages' if isinstance(messages, (list, tuple)) else ''}; "
                         f"expected a list of {{role, content}} messages (the opening system and user turns)")
    return list(messages)


_LMPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def defined_at(env, method: str) -> str:
    """` (file:line)` where the environment's class defines `method`, or "" where it cannot be found."""
    try:
        fn = inspect.unwrap(getattr(type(env), method))
        return f" ({inspect.getsourcefile(fn)}:{fn.__code__.co_firstlineno})"
    except (AttributeError, TypeError, OSError):
        return ""


def env_failure(err: BaseException) -> str:
    """`Type: message (file:line)` of an exception an environment raised, at the innermost frame
    outside lmpo (the user's own code, or the library it called; none for lmpo's own checks, whose
    message names the method): a bare `KeyError: 'id'` left the user to guess which line of their
    environment raised it."""
    frames = traceback.extract_tb(err.__traceback__)
    outside = [f for f in frames if not os.path.abspath(f.filename).startswith(_LMPO_DIR + os.sep)]
    what = f"{type(err).__name__}: {err}" if not isinstance(err, SystemExit) or err.code is not None else "SystemExit"
    return what + (f" ({outside[-1].filename}:{outside[-1].lineno})" if outside else "")


def env_raised(what: str, err: BaseException) -> str:
    """`MyEnv.step raised KeyError: 'id' (my_env.py:27)`, or `... called os._exit(3) (my_env.py:30)`."""
    if isinstance(err, ProcessExit):
        return f"{what} {env_failure(err).removeprefix(type(err).__name__ + ': ')}"
    return f"{what} raised {env_failure(err)}"


class Env(Protocol):
    def reset(self, problem: Problem) -> list[dict]:
        """Start an episode; return its opening messages (system and user turns)."""

    def step(self, action_text: str) -> Step:
        """React to the model's turn (its text before EOS)."""


EnvFactory = Callable[[], Env]


class SingleTurnEnv:
    """A task without tools: the prompt is the problem's text, the first turn is the answer.
    The answer is graded by the task's grader through the reward functions, as in evaluation."""

    def reset(self, problem: Problem) -> list[dict]:
        return [{"role": "user", "content": problem.prompt}]

    def step(self, action_text: str) -> Step:
        return Step(done=True, info={"answer": action_text})


def env_factory(task: Task) -> EnvFactory:
    """The task's own environments (`task.make_env()`) or, for a single-turn task, SingleTurnEnv."""
    make = getattr(task, "make_env", None)
    return make if callable(make) else SingleTurnEnv


def uses_chat_template(task: Task) -> bool:
    """Multi-turn tasks render their conversations with the tokenizer's chat template; a
    single-turn task's prompt is its text as written (users' chat prompts are rendered when loaded)."""
    return bool(getattr(task, "chat", False))


def tool_schemas(task: Task) -> list[dict] | None:
    """The function schemas a task's chat template shows the model (None: no tools). RL and eval
    prompts, SFT demonstrations and CPT documents all render with them, so the model learns on
    the prompt it is later given."""
    schemas = getattr(task, "tool_schemas", None)
    return (schemas() or None) if callable(schemas) else None
