"""A task as a new user writes it against the `Task` protocol, outside lmpo: copy a short
string of letters backwards (`abc>` → `cba`). Used by tests/test_task_plugins.py through
`--task tests/data/user_task.py:Reverse`."""

import hashlib
import random

from lmpo.envs.base import Grade, Problem

LETTERS = "abcdef"


class Reverse:
    def __init__(self, length: int = 3, heldout_share: float = 0.2):
        self.length, self.heldout_share = length, heldout_share
        self.name = f"reverse(length={length})"

    def make(self, text: str) -> Problem:
        return Problem(prompt=f"{text}>", answer=text[::-1], meta={"text": text})

    def is_heldout(self, problem: Problem) -> bool:
        return self._heldout(problem.meta["text"])

    def _heldout(self, text: str) -> bool:
        return hashlib.sha256(text.encode()).digest()[0] / 256 < self.heldout_share

    def _draw(self, rng: random.Random, heldout: bool) -> str:
        while True:
            text = "".join(rng.choice(LETTERS) for _ in range(self.length))
            if self._heldout(text) == heldout:
                return text

    def train_problems(self, n: int, seed: int) -> list[Problem]:
        rng = random.Random(f"train:{seed}")
        return [self.make(self._draw(rng, False)) for _ in range(n)]

    def heldout_problems(self, n: int) -> list[Problem]:
        rng = random.Random("heldout")
        return [self.make(self._draw(rng, True)) for _ in range(n)]

    def grade(self, problem: Problem, completion: str, terminated: bool) -> Grade:
        well_formed = terminated and completion.isalpha()
        return Grade(correct=well_formed and completion == problem.answer, well_formed=well_formed)

    def cpt_corpus(self, n_documents: int, seed: int) -> list[str]:
        return [f"{p.prompt}{p.answer}" for p in self.train_problems(n_documents, seed + 1000)]

    def sft_demonstrations(self, n: int, seed: int) -> list[Problem]:
        return self.train_problems(n, seed + 2000)


def reverse_of_four() -> Reverse:
    """A factory function works as well as a class."""
    return Reverse(length=4)
