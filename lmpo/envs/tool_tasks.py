"""Two embedded agentic tasks in which the tool is necessary, not decorative.

`vault`: each episode has its own SQLite table mapping keys (letters) to digit strings, drawn
afresh for the episode, so no answer can be memorised. The model must look its key up (`lookup(q)`),
then answer with the looked-up digits sorted, graded by the sort task's strict verifier.
`calculator`: `37*48 mod 100=?` — the product is beyond the 1M-parameter model, so it must call
`calculator(37*48)`, then read the last two digits off the result (`76`).

Why RL has something to learn (the sort task's recipe, see `sort_digits`): the agentic CPT
corpus is tool-use traces with a systematic flaw — vault traces sort with the sorter that drops
repeated digits (60%) and sometimes answer without looking up; calculator traces read the second and
third digits of the result (60%), which are the last two only for three-digit products. SFT
demonstrations show the format and the tool use only where the flaw does not matter (digit
strings without repeats; three-digit products). Sampling then finds the right behaviour sometimes, and a verifier reward lets RL
reinforce it.
"""

from __future__ import annotations

import hashlib
import random
import re
import sqlite3
import string

from lmpo.envs.base import Grade, Problem, check_recipe
from lmpo.envs.env import Env
from lmpo.envs.parsing import ToolCall, make_format
from lmpo.envs.tool_env import ToolEnv
from lmpo.envs.tools import CALCULATOR, Tool, ToolError, calculate, tool

_DIGITS_ONLY = re.compile(r"[0-9]+")


def _heldout(kind: str, key: str, share: float) -> bool:
    h = int.from_bytes(hashlib.sha256(f"{kind}:{key}".encode()).digest()[:8], "big")
    return h / 2**64 < share


def grade_digits(problem: Problem, completion: str, terminated: bool) -> Grade:
    well_formed = terminated and _DIGITS_ONLY.fullmatch(completion) is not None
    return Grade(correct=well_formed and completion == problem.answer, well_formed=well_formed)


TURN_SLACK = 8  # beyond the longest call: the end-of-turn token and some room (the compact caps leave 3 to 7)


class _ToolTask:
    """What both tasks share: chat rendering, a split by hash, traces, demonstrations, the env."""

    chat = True
    max_turns = 3
    kind = ""

    def __init__(self, flaw_rate: float, heldout_share: float, tool_format: str = "compact"):
        check_recipe(flaw_rate, heldout_share)
        self.flaw_rate, self.heldout_share = flaw_rate, heldout_share
        try:  # hermes: <tool_call>{json}</tool_call>, what Qwen-style templates teach
            self.fmt = make_format(tool_format)
        except ValueError as err:
            raise ValueError(f"task option tool_format: {err}") from None
        self._heldout_cache: dict[int, list[Problem]] = {}

    # -- problems -------------------------------------------------------------------------------
    def _draw(self, rng: random.Random, heldout: bool, easy: bool = False) -> Problem:
        raise NotImplementedError

    def _split_key(self, problem: Problem) -> str:
        raise NotImplementedError

    def is_heldout(self, problem: Problem) -> bool:
        return _heldout(self.kind, self._split_key(problem), self.heldout_share)

    def _sample(self, rng: random.Random, heldout: bool, easy: bool = False) -> Problem:
        while True:
            problem = self._draw(rng, heldout, easy)
            if self.is_heldout(problem) == heldout:
                return problem

    def train_problems(self, n: int, seed: int) -> list[Problem]:
        rng = random.Random(f"{self.kind}:train:{seed}")
        return [self._sample(rng, False) for _ in range(n)]

    def heldout_problems(self, n: int) -> list[Problem]:
        if n not in self._heldout_cache:
            rng = random.Random(f"{self.kind}:heldout")
            self._heldout_cache[n] = [self._sample(rng, True) for _ in range(n)]
        return self._heldout_cache[n]

    def grade(self, problem: Problem, completion: str, terminated: bool) -> Grade:
        return grade_digits(problem, completion, terminated)

    # -- the environment ----------------------------------------------------------------------------
    def opening(self, problem: Problem) -> list[dict]:
        return [{"role": "user", "content": problem.prompt}]

    def tools_for(self, problem: Problem) -> list[Tool]:
        raise NotImplementedError

    def make_env(self) -> Env:
        return ToolEnv(self.opening, self.tools_for, self.fmt)

    def tool_schemas(self) -> list[dict]:
        return [t.schema() for t in self.tools_for(self.train_problems(1, 0)[0])]

    # -- training data ------------------------------------------------------------------------------
    def _trace(self, problem: Problem, rng: random.Random, flawed: bool) -> list[dict]:
        raise NotImplementedError

    def cpt_corpus(self, n_documents: int, seed: int) -> list[list[dict]]:
        """Tool-use traces (conversations) for agentic continued pre-training, a `flaw_rate` share flawed."""
        rng = random.Random(f"{self.kind}:cpt:{seed}")
        return [self._trace(self._sample(rng, False), rng, rng.random() < self.flaw_rate) for _ in range(n_documents)]

    def sft_demonstrations(self, n: int, seed: int) -> list[list[dict]]:
        """Correct conversations on problems where the flaw makes no difference (format and tool use, not the fix)."""
        rng = random.Random(f"{self.kind}:sft:{seed}")
        return [self._trace(self._sample(rng, False, easy=True), rng, False) for _ in range(n)]

    def demonstration_calls(self) -> list[str]:
        """The call turns of the task's own CPT traces and SFT demonstrations (a sample of each)."""
        conversations = self.cpt_corpus(16, 0) + self.sft_demonstrations(16, 0)
        return [m["content"] for c in conversations for m in c
                if m["role"] == "assistant" and self.fmt.parse(m["content"]).calls]

    def _fit_budget_to_calls(self) -> None:
        """The class's turn cap and episode budget are the compact format's. A hermes call is five
        times as long (a calculator call is 85 characters, 17 in compact form), and a turn cut at
        the compact cap is never a call: the cap becomes the longest demonstration call in
        characters (a bound on its tokens under character and byte-level BPE tokenizers) plus
        some slack, and the episode budget grows by as much."""
        if self.fmt.name == "compact":
            return
        compact_turn, compact_episode = type(self).max_turn_tokens, type(self).max_tokens
        self.max_turn_tokens = max(len(call) for call in self.demonstration_calls()) + TURN_SLACK
        self.max_tokens = compact_episode + self.max_turn_tokens - compact_turn

    def _call(self, name: str, arguments: str) -> dict:
        if self.fmt.name == "compact":
            call = ToolCall(name, raw_arguments=arguments)
        else:  # a JSON call names its argument: each of these tools takes one string
            (tool_,) = [t for t in self.tools_for(self.train_problems(1, 0)[0]) if t.name == name]
            call = ToolCall(name, arguments={tool_.parameters["required"][0]: arguments})
        return {"role": "assistant", "content": self.fmt.render_call(call)}


class Vault(_ToolTask):
    """Look a key up in this episode's vault, answer with its digits sorted."""

    kind = "vault"
    max_turn_tokens = 16
    max_tokens = 48
    # SFT must teach the key copy and the call format (measured: 300 demonstrations x 3 epochs left
    # 33% of turns without EOS and keys miscopied, so RL sampled 1.5% right); the flaw stays.
    pipeline_settings = {"sft": {"demonstrations": 3000, "epochs": 2}}

    def __init__(self, length: int = 5, rows: int = 6, flaw_rate: float = 0.6, skip_rate: float = 0.1,
                 heldout_share: float = 0.1, tool_format: str = "compact"):
        super().__init__(flaw_rate, heldout_share, tool_format)
        if length < 2 or rows < 1:
            raise ValueError(f"length must be >= 2 and rows >= 1, got length={length}, rows={rows}")
        if not 0 <= skip_rate <= 1:
            raise ValueError(f"skip_rate must be in [0, 1], got {skip_rate}")
        self.length, self.rows, self.skip_rate = length, rows, skip_rate
        self.name = f"vault(length={length})"
        self._fit_budget_to_calls()

    def _draw(self, rng: random.Random, heldout: bool, easy: bool = False) -> Problem:
        keys = rng.sample(string.ascii_lowercase, self.rows)
        table = [(k, "".join(rng.sample("0123456789", self.length)) if easy and i == 0 else
                  "".join(rng.choice("0123456789") for _ in range(self.length))) for i, k in enumerate(keys)]
        rng.shuffle(table)
        key = keys[0]
        digits = dict(table)[key]
        return Problem(prompt=f"key {key}", answer="".join(sorted(digits)),
                       meta={"key": str(key), "digits": digits, "table": table})

    def _split_key(self, problem: Problem) -> str:
        return problem.meta["digits"]

    def tools_for(self, problem: Problem) -> list[Tool]:
        db = sqlite3.connect(":memory:", check_same_thread=False)
        db.execute("CREATE TABLE vault (key TEXT PRIMARY KEY, digits TEXT)")
        db.executemany("INSERT INTO vault VALUES (?, ?)", problem.meta["table"])

        def lookup(key: str) -> str:
            """Read the digits stored under a key in this episode's vault.

            Args:
                key: the vault key, one letter.
            """
            row = db.execute("SELECT digits FROM vault WHERE key = ?", (key.strip(),)).fetchone()
            if row is None:
                raise ToolError(f"no key {key.strip()!r} in the vault")
            return row[0]

        return [tool(lookup)]

    def _trace(self, problem: Problem, rng: random.Random, flawed: bool) -> list[dict]:
        digits = problem.meta["digits"]
        opening = self.opening(problem)
        if flawed and rng.random() < self.skip_rate / max(self.flaw_rate, 1e-9):
            # the flaw of answering before looking anything up
            guess = "".join(sorted(rng.choice("0123456789") for _ in range(self.length)))
            return [*opening, {"role": "assistant", "content": guess}]
        answer = "".join(sorted(set(digits))) if flawed else "".join(sorted(digits))
        return [*opening, self._call("lookup", problem.meta["key"]), {"role": "tool", "content": digits},
                {"role": "assistant", "content": answer}]


class Calculator(_ToolTask):
    """`37*48 mod 100=?`: the last two digits of a product of two-digit numbers. The model calls
    `calculator(37*48)` and answers the last two digits of the result (`76`)."""

    kind = "calculator"
    max_turn_tokens = 20
    max_tokens = 48
    pipeline_settings = {"sft": {"demonstrations": 3000, "epochs": 2}}  # as vault: SFT teaches the copy

    def __init__(self, flaw_rate: float = 0.6, heldout_share: float = 0.1, tool_format: str = "compact"):
        super().__init__(flaw_rate, heldout_share, tool_format)
        self.name = "calculator"
        self._fit_budget_to_calls()

    def _draw(self, rng: random.Random, heldout: bool, easy: bool = False) -> Problem:
        while True:
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            if not easy or a * b < 1000:
                return Problem(prompt=f"{a}*{b} mod 100=?", answer=f"{a * b % 100:02d}",
                               meta={"product": f"{a}*{b}"})

    def _split_key(self, problem: Problem) -> str:
        return problem.meta["product"]

    def tools_for(self, problem: Problem) -> list[Tool]:
        return [CALCULATOR]

    def _trace(self, problem: Problem, rng: random.Random, flawed: bool) -> list[dict]:
        product = calculate(problem.meta["product"])
        # the flawed reader takes the second and third digits: right for 3-digit products
        # (925 -> 25), wrong for 4-digit ones (1776 -> 77, not 76)
        answer = product[1:3] if flawed else product[-2:]
        return [*self.opening(problem), self._call("calculator", problem.meta["product"]),
                {"role": "tool", "content": product}, {"role": "assistant", "content": answer}]
