"""What a task is: problems with a held-out split, and one grader that serves both
evaluation and reward."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Problem:
    """`prompt` is the text the policy continues. A prompt file's row given as a list of messages
    keeps them in `messages` (and its `tools` column's schemas in `tools`), `prompt` being their
    rendering with the policy's chat template: a chat reward model renders them with its own, as
    it was trained, rather than reading the rendered text as one user turn."""

    prompt: str
    answer: str
    meta: dict = field(default_factory=dict, compare=False)
    messages: list | None = field(default=None, compare=False)
    tools: list | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Grade:
    """`correct`: the answer is right and terminated. `well_formed`: the completion has the
    task's answer format and ends with EOS, whether or not the answer is right."""

    correct: bool
    well_formed: bool


class Task(Protocol):
    """A task. Optional attributes a multi-turn task adds (read with defaults where absent):
    `chat = True` (render with the chat template), `make_env()` (a fresh `Env` per episode; else
    `SingleTurnEnv`), `tool_schemas()` (for the template), `max_turns`, `max_turn_tokens`,
    `max_tokens` and `max_observation_chars` (episode limits), `pipeline_settings` ({stage:
    {option: value}} it suggests). Such a task's `cpt_corpus` and `sft_demonstrations` return
    conversations (lists of messages)."""

    name: str

    def train_problems(self, n: int, seed: int) -> list[Problem]:
        """`n` problems from the training split, reproducible from `seed`."""

    def heldout_problems(self, n: int) -> list[Problem]:
        """The first `n` problems of the held-out split; never in any training stage."""

    def is_heldout(self, problem: Problem) -> bool: ...

    def grade(self, problem: Problem, completion: str, terminated: bool) -> Grade:
        """Strictly parse `completion` (text before EOS); malformed output is incorrect, never an error."""

    def cpt_corpus(self, n_documents: int, seed: int) -> list[str]:
        """Raw documents for continued pre-training, from the training split only."""

    def sft_demonstrations(self, n: int, seed: int) -> list[Problem]:
        """Problems whose `answer` is a demonstration for supervised fine-tuning."""


def check_recipe(flaw_rate: float, heldout_share: float) -> None:
    """The two numbers of the embedded tasks' recipe: the flawed share of the CPT corpus and the
    held-out share of the problems."""
    if not 0 <= flaw_rate <= 1:
        raise ValueError(f"flaw_rate must be in [0, 1], got {flaw_rate}")
    if not 0 < heldout_share < 1:
        raise ValueError(f"heldout_share must be in (0, 1), got {heldout_share}")


EPISODE_LIMITS = {  # a task's own limit -> (its least value, what it counts)
    "max_turns": (1, "model turns an episode may take"),
    "max_tokens": (1, "token budget of an episode after its prompt"),
    "max_turn_tokens": (0, "the cap on one model turn, 0: the budget"),
    "max_observation_chars": (1, "the characters of one observation the model sees"),
    "env_workers": (1, "environments stepped at once"),
}
AGENT_LIMITS = {  # what a task with `make_env` must declare (docs/agents.md), and what it would get without
    "max_turns": "an episode has one turn, and every tool call ends it",
    "max_tokens": "an episode gets --max_new_tokens' default of 12 tokens",
}


def limit_problems(task) -> list[str]:
    """What is wrong with the episode limits a task declares (see `Task`), checked when it is made:
    a wrong one would fail deep in a trainer, or after the model loaded, not naming the task (and
    `--max_turns 0` means the task's own, so "max_turns must be >= 1" read as the option's fault).
    The rollout reads them with defaults, so an agent task (one with `make_env`) lacking one would
    run as the default in silence, and a multi-turn task lacking `make_env` as a single-turn one."""
    problems = []
    for name, (least, counts) in EPISODE_LIMITS.items():
        value = getattr(task, name, least)
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{name} must be an integer >= {least} ({counts}), got {value!r} "
                            f"({type(value).__name__})")
        elif value < least:
            problems.append(f"{name} must be >= {least}, got {value}")
    timeout = getattr(task, "env_timeout", 0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 <= timeout < float("inf"):
        problems.append(f"env_timeout must be a number of seconds >= 0 (how long one call of an environment may "
                        f"take; 0: no limit), got {timeout!r}")
    if callable(getattr(task, "make_env", None)):
        return problems + [f"{name} is missing: a task with make_env() declares the {EPISODE_LIMITS[name][1]}; without "
                           f"it {default}" for name, default in AGENT_LIMITS.items() if not hasattr(task, name)]
    turns = getattr(task, "max_turns", 1)
    if isinstance(turns, int) and not isinstance(turns, bool) and turns > 1:
        problems.append(f"max_turns = {turns} asks for multi-turn episodes, but the task has no make_env() to answer "
                        f"the model's turns, so each episode would end at its first answer; add make_env() "
                        f"(lmpo.envs.tool_env.ToolEnv does for most tasks), or drop max_turns")
    return problems
