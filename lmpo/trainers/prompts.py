"""Where a run's prompts come from (a user's file or the task's own splits), and a
reproducible, resumable stream of the training ones."""

from __future__ import annotations

import inspect
import random
from dataclasses import dataclass
from typing import Sequence

from lmpo.envs import Problem


@dataclass
class PromptColumns:
    """The columns of a prompt file (`--prompts`, `--eval_prompts`) that hold the prompt and the answer."""

    prompt_field: str = "prompt"
    """The column holding each prompt in --prompts and --eval_prompts files (e.g. question, for GSM8K's); for SFT and CPT also in --data rows of a prompt and an answer, trained as prompt/completion."""
    answer_field: str = "answer"
    """The column holding each prompt's answer, for the grader (--task exact_match compares completions with it); for SFT and CPT also the completion of --data rows of a prompt and an answer."""


@dataclass
class PromptFileOptions(PromptColumns):
    """A sampling trainer's own prompt files (RL, online DPO, RFT)."""

    prompts: str = ""
    """Train on the prompts of this file instead of the task's (JSONL, JSON, Parquet, CSV/TSV (those but Parquet also .gz/.bz2/.xz) or a `datasets` directory, `DIR::split`): a `prompt` column (text, or messages rendered with the chat template; another with --prompt_field) and an `answer` column for the grader (--answer_field); other columns reach reward functions as `problem.meta`."""
    eval_prompts: str = ""
    """Evaluate on the prompts of this file (same columns) instead of the task's held-out split."""


def training_prompts(task, loaded: dict[str, list], prompts: str, pool_size: int, seed: int, tag: str) -> list[Problem]:
    """The rows of the file `prompts` (as `lmpo.trainers.preflight.load_prompt_files` loaded them
    into `loaded`), else `pool_size` problems of the task's training split."""
    if not prompts:
        return task_training_problems(task, pool_size, seed)
    print(f"[{tag}] {len(loaded['prompts'])} training prompts from {prompts}")
    return loaded["prompts"]


def task_training_problems(task, pool_size: int, seed: int) -> list[Problem]:
    """The task's training split; one it returned empty is an error naming the task's class and
    file (the prompt stream's own error could not say whose split it was)."""
    problems = task.train_problems(pool_size, seed)
    if not problems:
        cls = type(task)
        got = "0 problems" if problems is not None else "None"
        raise ValueError(f"task {getattr(task, 'name', cls.__name__)!r} ({cls.__qualname__} in {_source(cls)}): "
                         f"{cls.__qualname__}.train_problems(n={pool_size}, seed={seed}) returned {got}; "
                         f"training needs at least one problem")
    return problems


def _source(cls: type) -> str:
    try:
        return inspect.getfile(cls)
    except (TypeError, OSError):
        return cls.__module__


def heldout_prompts(task, loaded: dict[str, list], eval_prompts: str, n: int, tag: str = "") -> list[Problem]:
    """The first `n` rows of the file `eval_prompts` (loaded as for `training_prompts`), else the
    task's first `n` held-out problems; with a `tag`, the run says which when it trains on a
    prompt file of its own (whose prompts the task's held-out problems may not resemble)."""
    if eval_prompts:
        return loaded["eval_prompts"][:n]
    problems = task.heldout_problems(n)
    if tag and "prompts" in loaded:
        print(f"[{tag}] held-out: {len(problems)} problems of the task's own held-out split ({task.name}), not "
              f"prompts like those of --prompts; --eval_prompts FILE evaluates on yours")
    return problems


class PromptStream:
    """Iterates a pool of problems in a fresh shuffled order each epoch.

    `position` (prompts taken so far) is the whole state: a resumed run sets it and then sees
    exactly the prompts an uninterrupted run would have seen.
    """

    def __init__(self, pool: Sequence[Problem], seed: int):
        if not pool:
            raise ValueError("the prompt pool is empty")
        self.pool, self.seed, self.position = list(pool), seed, 0
        self._epoch, self._order = -1, []

    def _order_for(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            self._order = list(range(len(self.pool)))
            random.Random(f"prompt-order:{self.seed}:{epoch}").shuffle(self._order)
            self._epoch = epoch
        return self._order

    def take(self, n: int) -> list[Problem]:
        out = []
        for _ in range(n):
            epoch, offset = divmod(self.position, len(self.pool))
            out.append(self.pool[self._order_for(epoch)[offset]])
            self.position += 1
        return out
