"""Two more embedded tasks, built on the sort task's recipe (a CPT corpus with a systematic flaw,
demonstrations only where the flaw does not show, a strict verifier), with other structures.

`reverse_digits`: `31415>` → `51413<eos>`. A *choice between two procedures*: in the CPT corpus a
`flaw_rate` share of lines copy the digits instead of reversing them (`31415>31415`), the way web
text mixes conventions. SFT demonstrations are palindromes, where copying and reversing agree, so
they teach the format and stopping but not which procedure is meant. Greedy decoding tends to
follow the majority (copy); samples reverse about as often as the corpus did, and a verifier
reward lets RL pick the right procedure.

`increment`: `41999+1=` → `42000<eos>`. *Carry propagation*: a `flaw_rate` share of CPT lines come
from an incrementer that forgets the carry (`41999+1=41990`). Half the problems end in 9 (one to
four trailing nines), so the carry matters; SFT demonstrations only use numbers not ending in 9.

Both split train/held-out by a hash of the input, so no training stage sees a held-out problem.
"""

from __future__ import annotations

import hashlib
import random
import re

from lmpo.envs.base import Grade, Problem, check_recipe

_DIGITS_ONLY = re.compile(r"[0-9]+")


def _hash_share(kind: str, key: str) -> float:
    return int.from_bytes(hashlib.sha256(f"{kind}:{key}".encode()).digest()[:8], "big") / 2**64


def grade_digits(problem: Problem, completion: str, terminated: bool) -> Grade:
    well_formed = terminated and _DIGITS_ONLY.fullmatch(completion) is not None
    return Grade(correct=well_formed and completion == problem.answer, well_formed=well_formed)


class _DigitTask:
    """The split, the sampling loops and the grader both tasks share; subclasses draw inputs."""

    kind = ""

    def __init__(self, flaw_rate: float, heldout_share: float):
        check_recipe(flaw_rate, heldout_share)
        self.flaw_rate, self.heldout_share = flaw_rate, heldout_share

    def make(self, key: str) -> Problem:
        raise NotImplementedError

    def flawed(self, key: str) -> str:
        raise NotImplementedError

    def _draw(self, rng: random.Random, demo: bool) -> str:
        raise NotImplementedError

    def _heldout_key(self, key: str) -> bool:
        return _hash_share(self.kind, key) < self.heldout_share

    def is_heldout(self, problem: Problem) -> bool:
        return self._heldout_key(problem.meta["key"])

    def _sample(self, rng: random.Random, heldout: bool = False, demo: bool = False) -> str:
        while True:
            key = self._draw(rng, demo)
            if self._heldout_key(key) == heldout:
                return key

    def train_problems(self, n: int, seed: int) -> list[Problem]:
        rng = random.Random(f"{self.kind}:train:{seed}")
        return [self.make(self._sample(rng)) for _ in range(n)]

    def heldout_problems(self, n: int) -> list[Problem]:
        """Distinct held-out problems in a fixed order (independent of any run seed)."""
        rng = random.Random(f"{self.kind}:heldout")
        seen: dict[str, Problem] = {}
        for _ in range(200 * n):
            if len(seen) == n:
                break
            key = self._sample(rng, heldout=True)
            seen.setdefault(key, self.make(key))
        if len(seen) < n:
            raise ValueError(f"asked for {n} held-out problems; {self.name} has only about {len(seen)}")
        return list(seen.values())

    def grade(self, problem: Problem, completion: str, terminated: bool) -> Grade:
        return grade_digits(problem, completion, terminated)

    def cpt_corpus(self, n_documents: int, seed: int) -> list[str]:
        """Lines `prompt + answer`, a `flaw_rate` share of them from the flawed procedure."""
        rng = random.Random(f"{self.kind}:cpt:{seed}")
        docs = []
        for _ in range(n_documents):
            problem = self.make(self._sample(rng))
            answer = self.flawed(problem.meta["key"]) if rng.random() < self.flaw_rate else problem.answer
            docs.append(problem.prompt + answer)
        return docs

    def sft_demonstrations(self, n: int, seed: int) -> list[Problem]:
        """Correct demonstrations only where the flawed procedure gives the same answer."""
        rng = random.Random(f"{self.kind}:sft:{seed}")
        return [self.make(self._sample(rng, demo=True)) for _ in range(n)]


class ReverseDigits(_DigitTask):
    """Write `length` decimal digits in reverse order."""

    kind = "reverse_digits"

    def __init__(self, length: int = 5, flaw_rate: float = 0.6, heldout_share: float = 0.1):
        if length < 3:
            raise ValueError(f"length must be >= 3, got {length}")
        super().__init__(flaw_rate, heldout_share)
        self.length = length
        self.name = f"reverse_digits(length={length})"

    def make(self, key: str) -> Problem:
        return Problem(prompt=f"{key}>", answer=key[::-1], meta={"key": key})

    def flawed(self, key: str) -> str:
        return key  # copied, not reversed

    def _draw(self, rng: random.Random, demo: bool) -> str:
        if demo:  # a palindrome: copying and reversing agree
            half = "".join(rng.choice("0123456789") for _ in range((self.length + 1) // 2))
            return half + half[: self.length // 2][::-1]
        return "".join(rng.choice("0123456789") for _ in range(self.length))


class Increment(_DigitTask):
    """Add one to a `digits`-digit number (no carry out of the first digit)."""

    kind = "increment"
    # the carry is found slowly and noisily by sampling: four times the sort task's RL steps,
    # evaluated every 100, stopping after 400 steps without a better held-out score
    pipeline_settings = {"rl": {"steps": 1000, "eval_every": 100, "stop_patience": 4}}

    def __init__(self, digits: int = 5, flaw_rate: float = 0.6, carry_share: float = 0.5,
                 heldout_share: float = 0.1):
        if digits < 2:
            raise ValueError(f"digits must be >= 2, got {digits}")
        if not 0 <= carry_share <= 1:
            raise ValueError(f"carry_share must be in [0, 1], got {carry_share}")
        super().__init__(flaw_rate, heldout_share)
        self.digits, self.carry_share = digits, carry_share
        self.name = f"increment(digits={digits})"

    def make(self, key: str) -> Problem:
        return Problem(prompt=f"{key}+1=", answer=str(int(key) + 1), meta={"key": key})

    def flawed(self, key: str) -> str:
        return key[:-1] + str((int(key[-1]) + 1) % 10)  # the last digit wraps, no carry

    def _draw(self, rng: random.Random, demo: bool) -> str:
        first = rng.choice("123456789")
        body = "".join(rng.choice("0123456789") for _ in range(self.digits - 1))
        key = first + body
        if demo:
            return key[:-1] + rng.choice("012345678")
        if rng.random() < self.carry_share:
            nines = rng.randint(1, self.digits - 1)
            key = key[: self.digits - nines] + "9" * nines
            if key[: self.digits - nines].endswith("9"):  # exactly `nines` trailing nines
                key = key[: self.digits - nines - 1] + rng.choice("012345678") + "9" * nines
                if key[0] == "0":
                    key = "1" + key[1:]
        return key


class CountDigit(_DigitTask):
    """How many times does a digit occur in a string of `length` digits? `314151:1=` → `3`.

    *Counting*, where sorting permutes and incrementing carries: in the CPT corpus a `flaw_rate`
    share of lines answer whether the digit occurs (`1`) instead of how often, the way text
    confuses "contains" with "how many". SFT demonstrations only use digits that occur at most
    once, where both readings agree. Counts 0 to `max_count` are equally likely. Counting is
    learned later than sorting from the corpus: the pipeline allows CPT three times the steps
    (its stopping rule ends it at 625-750 of them)."""

    kind = "count_digit"
    pipeline_settings = {"cpt": {"steps": 900}}

    def __init__(self, length: int = 6, max_count: int = 3, flaw_rate: float = 0.6, heldout_share: float = 0.1):
        if not 2 <= max_count <= length:
            raise ValueError(f"max_count must be in [2, length={length}], got {max_count}")
        super().__init__(flaw_rate, heldout_share)
        self.length, self.max_count = length, max_count
        self.name = f"count_digit(length={length})"

    def make(self, key: str) -> Problem:
        digits, target = key.split(":")
        return Problem(prompt=f"{key}=", answer=str(digits.count(target)), meta={"key": key})

    def flawed(self, key: str) -> str:
        digits, target = key.split(":")
        return "1" if target in digits else "0"  # "contains", not "how many"

    def _draw(self, rng: random.Random, demo: bool) -> str:
        target = rng.choice("0123456789")
        count = rng.randint(0, 1 if demo else self.max_count)
        others = [d for d in "0123456789" if d != target]
        digits = [target] * count + [rng.choice(others) for _ in range(self.length - count)]
        rng.shuffle(digits)
        return "".join(digits) + ":" + target
