"""The `aftersales` task: tickets against a company database, resolved with tools.

Training tickets come from the database of seed `db_seed`; held-out tickets from a fresh
database (`heldout_db_seed`): other customers, orders, dates and amounts, the same policies.

Why RL has something to learn (the recipe of `tool_tasks`): the CPT corpus is operation logs,
a `flaw_rate` share of them by a careless operator who does whatever the customer asks
(refunds late and large orders, changes the address of shipped ones): a flaw the guardrail
cannot see when the operator read the policy first, since the evidence is all there. A
`skip_policy_rate` share of the careless writes come without reading the policy at all, a
flaw the guardrail blocks at run time. SFT demonstrations cover only the
kinds where doing what is asked is right (`SFT_KINDS`), so SFT gives the model no reason to
do otherwise on the other kinds; refusing a late refund or a late address change and handing a large
refund to a human are left for GRPO to find, guided by the verifier.

Why the policy's numbers are what they are: a 1M-parameter character model reads whether a
number has one digit or two (or two or three) but, in minutes of training, not how 45 compares
with 30. With a 9-day window and a $100 limit, each decision is one digit count in the
looked-up order (measured: after CPT, a 30-day window's decision was a coin toss on held-out
orders; a 9-day one was right on 24 of 24). 5000 orders give ~100 refundable ones, so the
model cannot pass by remembering order numbers, and each amount it may refund alone has its
own first digit (see `db.PRODUCTS`).
"""

from __future__ import annotations

import math
import os
import random
from functools import cached_property

from lmpo.envs.aftersales.db import Policies, database_path, load_orders, policies_of, render_order, source
from lmpo.envs.aftersales.env import AftersalesEnv, Rewards
from lmpo.envs.aftersales.tickets import HANDOFF, KINDS, Ticket, TicketPool, flawed_steps, reference_calls
from lmpo.envs.aftersales.tools import EpisodeTools
from lmpo.envs.aftersales.verifier import reply_states
from lmpo.envs.base import Grade, Problem
from lmpo.envs.parsing import CompactFormat

SFT_KINDS = ("where", "addr", "cancel", "complaint")


class Aftersales:
    name = "aftersales"
    chat = True
    max_turns = 6
    max_turn_tokens = 32
    max_tokens = 192
    pipeline_settings = {
        # rows of 256 tokens (the tiny preset's context) hold a whole conversation
        "cpt": {"corpus_documents": 20000, "steps": 1200, "seq_len": 255, "batch_size": 16},
        "sft": {"demonstrations": 2000, "epochs": 2},
        "rl": {"rewards": "format=0.05", "temperature": 0.7, "steps": 120},  # the outcome and process rewards come from the environment
    }

    def __init__(self, flaw_rate: float = 0.6, skip_policy_rate: float = 0.5, db_seed: int = 0,
                 heldout_db_seed: int = 1, refund_window_days: int = 9, approval_limit: int = 100,
                 outcome: float = 1.0, process: float = 0.05, block_penalty: float = 0.1, handoff_cost: float = 0.0,
                 guardrail: int = 1, orders: int = 5000, sft_kinds: tuple[str, ...] = SFT_KINDS,
                 db_dir: str | os.PathLike | None = None):
        for name, value in (("db_seed", db_seed), ("heldout_db_seed", heldout_db_seed), ("orders", orders),
                            ("refund_window_days", refund_window_days), ("approval_limit", approval_limit)):
            if isinstance(value, bool) or not isinstance(value, int) and not str(value).strip().lstrip("-").isdigit():
                raise ValueError(f"aftersales option {name} must be a whole number, got {value!r}")
        for name, value in (("flaw_rate", flaw_rate), ("skip_policy_rate", skip_policy_rate)):
            try:
                share = float(value)
            except (TypeError, ValueError):
                share = math.nan
            if not 0 <= share <= 1:
                raise ValueError(f"aftersales option {name} must be a share in [0, 1], got {value!r}")
        for name, value in (("outcome", outcome), ("process", process), ("block_penalty", block_penalty),
                            ("handoff_cost", handoff_cost)):
            try:
                weight = float(value)
            except (TypeError, ValueError):
                weight = math.nan
            if isinstance(value, bool) or not math.isfinite(weight):
                raise ValueError(f"aftersales option {name} must be a finite number, got {value!r}")
        if db_seed == heldout_db_seed:
            raise ValueError("held-out tickets need their own database: db_seed must differ from heldout_db_seed")
        if int(orders) < 50:
            raise ValueError(f"orders must be at least 50 (every ticket kind needs orders to draw from), got {orders}")
        if isinstance(sft_kinds, str):  # from a task spec: aftersales:sft_kinds=where+cancel+complaint
            sft_kinds = tuple(k.strip() for k in sft_kinds.split("+") if k.strip())
        if not sft_kinds:
            raise ValueError(f"sft_kinds names no ticket kind; give some of {', '.join(KINDS)}, joined by +")
        unknown = set(sft_kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown ticket kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
        self.flaw_rate, self.skip_policy_rate = float(flaw_rate), float(skip_policy_rate)
        self.db_seed, self.heldout_db_seed = int(db_seed), int(heldout_db_seed)
        self.policies = Policies(int(refund_window_days), int(approval_limit))
        self.rewards = Rewards(float(outcome), float(process), float(block_penalty), float(handoff_cost))
        self.guardrail, self.sft_kinds, self.db_dir, self.orders = bool(guardrail), tuple(sft_kinds), db_dir, int(orders)
        self.fmt = CompactFormat()
        self._heldout_cache: dict[int, list[Problem]] = {}

    # -- databases and tickets ------------------------------------------------------------------
    def database(self, heldout: bool = False) -> str:
        """The source database file of the training (or held-out) tickets."""
        return str(database_path(self.heldout_db_seed if heldout else self.db_seed, self.policies, self.db_dir, self.orders))

    @cached_property
    def _pools(self) -> dict[bool, TicketPool]:
        pools = {}
        for heldout in (False, True):
            db = source(self.database(heldout))
            policies, today = policies_of(db)
            pools[heldout] = TicketPool(load_orders(db), policies, today)
        return pools

    def _problem(self, ticket: Ticket, heldout: bool) -> Problem:
        steps = ticket.steps
        answer = steps[-1][1]
        return Problem(prompt=ticket.prompt, answer=answer,
                       meta={"kind": ticket.kind, "db": self.database(heldout), "order": ticket.order.ref,
                             "expected": [list(c) for c in ticket.expected], "facts": list(ticket.facts),
                             "handoff": ticket.handoff, "heldout": heldout,
                             "reference_calls": [list(c) for c in reference_calls(ticket)]})

    def _tickets(self, n: int, rng: random.Random, heldout: bool, kinds: tuple[str, ...] = KINDS) -> list[Ticket]:
        pool = self._pools[heldout]
        return [pool.draw(kinds[i % len(kinds)] if heldout else rng.choice(kinds), rng) for i in range(n)]

    def train_problems(self, n: int, seed: int) -> list[Problem]:
        rng = random.Random(f"aftersales:train:{seed}")
        return [self._problem(t, False) for t in self._tickets(n, rng, False)]

    def heldout_problems(self, n: int) -> list[Problem]:
        """Every kind in turn (balanced), from the held-out database."""
        if n not in self._heldout_cache:
            rng = random.Random("aftersales:heldout")
            self._heldout_cache[n] = [self._problem(t, True) for t in self._tickets(n, rng, True)]
        return self._heldout_cache[n]

    def is_heldout(self, problem: Problem) -> bool:
        return bool(problem.meta.get("heldout"))

    # -- grading ------------------------------------------------------------------------------------
    def grade(self, problem: Problem, completion: str, terminated: bool) -> Grade:
        """The final turn alone: the reply states the required facts (or, for a ticket that
        must go to a human, the turn is the hand-off). The database half of the verdict needs
        the episode: `grade_trajectory` gives the full verdict, and evaluation uses it."""
        well_formed = terminated and bool(completion.strip())
        if problem.meta["handoff"]:
            correct = completion.strip() == f"{HANDOFF}({problem.meta['order']})"
        else:
            correct = reply_states(completion, tuple(problem.meta["facts"]))
        return Grade(correct=well_formed and correct, well_formed=well_formed)

    def grade_trajectory(self, trajectory) -> Grade:
        """The verifier's verdict on the episode's final database and reply (set when it ended)."""
        return Grade(correct=trajectory.terminated and trajectory.info.get("verdict") is True,
                     well_formed=trajectory.terminated)

    # -- the environment ------------------------------------------------------------------------------
    def make_env(self) -> AftersalesEnv:
        return AftersalesEnv(self.rewards, self.fmt, guardrail=self.guardrail)

    def tool_schemas(self) -> list[dict]:
        from lmpo.envs.aftersales.db import episode_copy

        return [t.schema() for t in EpisodeTools(episode_copy(self.database())).tools()]

    # -- training data ------------------------------------------------------------------------------
    def conversation(self, ticket: Ticket, steps) -> list[dict]:
        """A resolution as chat messages, with the observations the tools give before any write."""
        pool = self._pools[False]
        handbook = {d["id"]: d["text"] for d in pool.policies.handbook()}
        messages = [{"role": "user", "content": ticket.prompt}]
        for kind, text in steps:
            messages.append({"role": "assistant", "content": text})
            if kind == "reply" or text.startswith(HANDOFF):
                break
            if text.startswith("lookup_order("):
                observation = render_order(ticket.order, pool.today)
            elif text.startswith("search_policy("):
                observation = handbook[text[len("search_policy("):-1]]
            else:
                observation = "ok"
            messages.append({"role": "tool", "content": observation})
        return messages

    def cpt_corpus(self, n_documents: int, seed: int) -> list[list[dict]]:
        """Operation logs (conversations), a `flaw_rate` share by the careless operator, who skips
        the policy on a `skip_policy_rate` share of them."""
        rng = random.Random(f"aftersales:cpt:{seed}")
        out = []
        for ticket in self._tickets(n_documents, rng, False):
            flawed, skips = rng.random() < self.flaw_rate, rng.random() < self.skip_policy_rate
            out.append(self.conversation(ticket, flawed_steps(ticket, read_policy=not skips) if flawed else ticket.steps))
        return out

    def sft_demonstrations(self, n: int, seed: int) -> list[list[dict]]:
        """Correct resolutions of the `sft_kinds` tickets only."""
        rng = random.Random(f"aftersales:sft:{seed}")
        return [self.conversation(t, t.steps) for t in self._tickets(n, rng, False, self.sft_kinds)]
