"""The embedded task: sort a short string of digits.

`31415=` → `11345<eos>`. Why this task: a 1M-parameter model learns it on a CPU within
minutes (multi-digit addition does not; see shared notes), and a verifier checks it exactly.

Why RL has something to learn here: the continued pre-training corpus, like real web text,
carries a systematic error. A share of its sorting lines (`flaw_rate`, 60% by default) come
from a flawed sorter that drops repeated digits (`31415=1345`). The SFT demonstrations only
use digit strings without repeats, so SFT teaches the format and when to stop, but not the
fix. After SFT, greedy decoding inherits the flaw on strings with repeated digits while
samples are often right; a verifier reward lets RL find and reinforce the right answers.

The train/held-out split is a fixed function of the digit string (a hash), so no training
stage can ever see a held-out problem, whatever the seeds.
"""

from __future__ import annotations

import hashlib
import random
import re

from lmpo.envs.base import Grade, Problem

_DIGITS_ONLY = re.compile(r"[0-9]+")


class SortDigits:
    """Sort `length` decimal digits ascending."""

    def __init__(self, length: int = 5, flaw_rate: float = 0.6, heldout_share: float = 0.1):
        if length < 2:
            raise ValueError(f"length must be >= 2, got {length}")
        if not 0 <= flaw_rate <= 1:
            raise ValueError(f"flaw_rate must be in [0, 1], got {flaw_rate}")
        if not 0 < heldout_share < 1:
            raise ValueError(f"heldout_share must be in (0, 1), got {heldout_share}")
        self.length, self.flaw_rate, self.heldout_share = length, flaw_rate, heldout_share
        self.name = f"sort_digits(length={length})"
        self._heldout_cache: list[Problem] | None = None

    # -- problems -------------------------------------------------------------------------
    def make(self, digits: str) -> Problem:
        return Problem(prompt=f"{digits}=", answer="".join(sorted(digits)), meta={"digits": digits})

    def is_heldout(self, problem: Problem) -> bool:
        return self._heldout_digits(problem.meta.get("digits", problem.prompt.rstrip("=")))

    def _heldout_digits(self, digits: str) -> bool:
        h = int.from_bytes(hashlib.sha256(f"sort_digits:{digits}".encode()).digest()[:8], "big")
        return h / 2**64 < self.heldout_share

    def _random_train_digits(self, rng: random.Random, distinct: bool = False) -> str:
        while True:
            if distinct:
                digits = "".join(rng.sample("0123456789", self.length))
            else:
                digits = "".join(rng.choice("0123456789") for _ in range(self.length))
            if not self._heldout_digits(digits):
                return digits

    def train_problems(self, n: int, seed: int) -> list[Problem]:
        rng = random.Random(f"train:{seed}")
        return [self.make(self._random_train_digits(rng)) for _ in range(n)]

    def heldout_problems(self, n: int) -> list[Problem]:
        """The held-out set in a fixed order (independent of any run seed)."""
        rng = random.Random("heldout")
        seen: set[str] = set()
        out: list[Problem] = []
        space = 10**self.length
        if n > space * self.heldout_share * 0.9:
            raise ValueError(f"asked for {n} held-out problems; length {self.length} has only about {int(space * self.heldout_share)}")
        while len(out) < n:
            digits = "".join(rng.choice("0123456789") for _ in range(self.length))
            if digits not in seen and self._heldout_digits(digits):
                seen.add(digits)
                out.append(self.make(digits))
        return out

    # -- grader: one function for evaluation and reward -------------------------------------
    def grade(self, problem: Problem, completion: str, terminated: bool) -> Grade:
        well_formed = terminated and _DIGITS_ONLY.fullmatch(completion) is not None
        return Grade(correct=well_formed and completion == problem.answer, well_formed=well_formed)

    # -- training data ----------------------------------------------------------------------
    def cpt_corpus(self, n_documents: int, seed: int) -> list[str]:
        """Lines `digits=sorted`, a `flaw_rate` share of them from the repeat-dropping sorter."""
        rng = random.Random(f"cpt:{seed}")
        docs = []
        for _ in range(n_documents):
            digits = self._random_train_digits(rng)
            flawed = rng.random() < self.flaw_rate
            answer = "".join(sorted(set(digits))) if flawed else "".join(sorted(digits))
            docs.append(f"{digits}={answer}")
        return docs

    def sft_demonstrations(self, n: int, seed: int) -> list[Problem]:
        """Correct demonstrations on digit strings without repeats (format, not the fix)."""
        rng = random.Random(f"sft:{seed}")
        return [self.make(self._random_train_digits(rng, distinct=True)) for _ in range(n)]

    # -- preference data ----------------------------------------------------------------------
    def preference_pairs(self, n: int, seed: int, heldout: bool = False) -> list[tuple[Problem, str, str]]:
        """(problem, chosen, rejected): chosen is the right answer; rejected a wrong one, often
        a near miss (the flawed sorter's output, two digits swapped, one digit off by one, a
        digit dropped or inserted, sorted digits that are not the input's, the sorted input with one
        digit replaced, or the input unsorted). Held-out pairs come from held-out problems."""
        rng = random.Random(f"pairs:{seed}:{heldout}")
        problems = self.heldout_problems(n) if heldout else self.train_problems(n, seed)
        return [(p, p.answer, self._wrong_answer(p, rng)) for p in problems]

    def _wrong_answer(self, problem: Problem, rng: random.Random) -> str:
        right = problem.answer
        digits = problem.meta["digits"]
        while True:
            kind = rng.randrange(8)
            if kind == 0:
                wrong = "".join(sorted(set(digits)))
            elif kind == 1:
                i = rng.randrange(len(right) - 1)
                wrong = right[:i] + right[i + 1] + right[i] + right[i + 2:]
            elif kind == 2:
                i = rng.randrange(len(right))
                wrong = right[:i] + str((int(right[i]) + rng.choice((1, 9))) % 10) + right[i + 1:]
            elif kind == 3:
                i = rng.randrange(len(right))
                wrong = right[:i] + right[i + 1:]
            elif kind == 4:
                i = rng.randrange(len(right) + 1)
                wrong = right[:i] + rng.choice("0123456789") + right[i:]
            elif kind == 5:  # sorted and the right length, but not these digits
                wrong = "".join(sorted(rng.choice("0123456789") for _ in right))
            elif kind == 6:  # sorted, one digit replaced: the hardest near miss to tell apart
                i = rng.randrange(len(right))
                wrong = "".join(sorted(right[:i] + rng.choice("0123456789") + right[i + 1:]))
            else:
                wrong = digits
            if wrong != right:
                return wrong
