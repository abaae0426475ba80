"""The agent's tools over one episode's copy of the database, and the evidence guardrail.

Read tools (`lookup_order`, `lookup_customer`, `search_policy`) record what the agent has seen.
Write tools (`issue_refund`, `update_address`, `cancel_order`, `escalate_to_human`) check that
record before they write: the order was looked up in this episode, a refund does not exceed
what the order has left to refund (what its lookup showed, less the refunds made since), and
the handbook document that allows the write was consulted. A hand-off needs the lookup only.
A write without that evidence raises `Blocked`: nothing is written, and the agent is told why.
Bad input (an unknown order, an amount that is not a finite number) raises ToolError instead.
"""

from __future__ import annotations

import math
import re
import sqlite3
from dataclasses import dataclass, field

from lmpo.envs.aftersales.db import get_order, parse_order_ref, policies_of, render_order
from lmpo.envs.aftersales.tickets import HANDOFF, POLICY_FOR
from lmpo.envs.tools import BadArguments, SearchIndex, Tool, ToolError, tool

READ_TOOLS = ("lookup_order", "lookup_customer", "search_policy")
WRITE_TOOLS = ("issue_refund", "update_address", "cancel_order", HANDOFF)


class Blocked(ToolError):
    """A write the guardrail refused for want of evidence."""


@dataclass
class Evidence:
    """What the agent read in this episode."""

    orders: dict[int, int] = field(default_factory=dict)
    """Order id -> what is left to refund: the amount its lookup showed, less this episode's refunds."""
    policies: set[str] = field(default_factory=set)
    """Handbook documents returned by search_policy."""


_INDEXES: dict[tuple, SearchIndex] = {}


def handbook_index(db: sqlite3.Connection) -> SearchIndex:
    docs = tuple(db.execute("SELECT id, title, text FROM handbook ORDER BY id").fetchall())
    if docs not in _INDEXES:  # every episode of a database shares one index (searches do not mutate it)
        _INDEXES[docs] = SearchIndex([{"id": i, "title": t, "text": x} for i, t, x in docs])
    return _INDEXES[docs]


class EpisodeTools:
    """The tools of one episode, bound to its database copy `db`."""

    def __init__(self, db: sqlite3.Connection, guardrail: bool = True):
        self.db, self.guardrail = db, guardrail
        self.policies, self.today = policies_of(db)
        self.evidence = Evidence()
        self.handbook = handbook_index(db)
        self.handed_off = False
        self.log: list[tuple[str, str]] = []
        """Every call that succeeded, as (tool, what it was about: `o17`, `c4` or a handbook document)."""

    def _order(self, ref: str):
        order_id = parse_order_ref(ref)
        order = get_order(self.db, order_id) if order_id is not None else None
        if order is None:
            raise ToolError(f"unknown order {ref.strip()[:20]!r}")
        return order

    def _require(self, order_id: int, write: str) -> None:
        if not self.guardrail:
            return
        if order_id not in self.evidence.orders:
            raise Blocked(f"blocked: look up o{order_id} first")
        policy = POLICY_FOR.get(write)
        if policy and policy not in self.evidence.policies:
            raise Blocked(f"blocked: read the {policy} policy first")

    # -- read tools ---------------------------------------------------------------------------------
    def lookup_order(self, order: str) -> str:
        """Look an order up: its status, delivery or eta, and amount.

        Args:
            order: the order id, like o17.
        """
        found = self._order(order)
        self.evidence.orders[found.id] = found.amount - found.refunded
        self.log.append(("lookup_order", found.ref))
        return render_order(found, self.today)

    def lookup_customer(self, customer: str) -> str:
        """Look a customer up: name, city and number of orders.

        Args:
            customer: the customer id, like c4.
        """
        text = customer.strip().lower().removeprefix("c")
        customer_id = int(text) if re.fullmatch(r"[0-9]{1,8}", text) else -1
        row = self.db.execute("SELECT c.name, c.city, (SELECT COUNT(*) FROM orders o WHERE o.customer_id = c.id)"
                              " FROM customers c WHERE c.id = ?", (customer_id,)).fetchone()
        if row is None:
            raise ToolError(f"unknown customer {customer.strip()[:20]!r}")
        self.log.append(("lookup_customer", f"c{customer_id}"))
        return f"c{customer_id} {row[0]}, {row[1]}, {row[2]} orders"

    def search_policy(self, query: str) -> str:
        """Search the policy handbook and return the best matching rule.

        Args:
            query: words to look for, like refund.
        """
        hits = self.handbook.search(query, k=1)
        if not hits:
            return f"no policy for {query.strip()[:30]!r}"
        self.evidence.policies.add(hits[0][0])
        self.log.append(("search_policy", hits[0][0]))
        return self.handbook.open(hits[0][0]).split("\n", 1)[1]

    # -- write tools --------------------------------------------------------------------------------
    def issue_refund(self, order: str, amount: float) -> str:
        """Refund an order (needs: the order looked up and the refund policy read).

        Args:
            order: the order id, like o17.
            amount: dollars to refund, at most the order's amount.
        """
        found = self._order(order)
        if not math.isfinite(amount) or amount <= 0 or amount != int(amount):
            raise ToolError(f"bad amount {amount:g}: whole dollars above 0")
        self._require(found.id, "issue_refund")
        left = self.evidence.orders.get(found.id)
        if self.guardrail and amount > left:
            refunded_here = ("issue_refund", found.ref) in self.log
            raise Blocked(f"blocked: {found.ref} has ${left} left to refund" if refunded_here
                          else f"blocked: {found.ref} shows ${left}")
        self.db.execute("INSERT INTO refunds (order_id, amount, issued_on, issued_by) VALUES (?, ?, ?, 'agent')",
                        (found.id, int(amount), self.today.isoformat()))
        if left is not None:
            self.evidence.orders[found.id] = left - int(amount)
        self.log.append(("issue_refund", found.ref))
        return "ok"

    def update_address(self, order: str, address: str) -> str:
        """Change an order's shipping address (needs: the order looked up and the address policy read).

        Args:
            order: the order id, like o17.
            address: the new address, like Elm 5.
        """
        found = self._order(order)
        if not address.strip():
            raise ToolError("empty address")
        self._require(found.id, "update_address")
        self.db.execute("UPDATE orders SET ship_address = ? WHERE id = ?", (address.strip(), found.id))
        self.log.append(("update_address", found.ref))
        return "ok"

    def cancel_order(self, order: str) -> str:
        """Cancel an order (needs: the order looked up and the cancel policy read).

        Args:
            order: the order id, like o17.
        """
        found = self._order(order)
        if found.status == "cancelled":
            raise ToolError(f"{found.ref} is already cancelled")
        self._require(found.id, "cancel_order")
        self.db.execute("UPDATE orders SET status = 'cancelled' WHERE id = ?", (found.id,))
        self.log.append(("cancel_order", found.ref))
        return "ok"

    def escalate_to_human(self, order: str) -> str:
        """Hand the ticket to a human (needs: the order looked up); ends the episode.

        Args:
            order: the order id, like o17.
        """
        found = self._order(order)
        self._require(found.id, HANDOFF)
        self.db.execute("INSERT INTO handoffs (order_id, reason, created_on) VALUES (?, 'agent', ?)",
                        (found.id, self.today.isoformat()))
        self.handed_off = True
        self.log.append((HANDOFF, found.ref))
        return "handed to a human"

    def tools(self) -> list[Tool]:
        return [tool(getattr(self, name), name=name) for name in (*READ_TOOLS, *WRITE_TOOLS)]


def compact_arguments(chosen: Tool, raw: str) -> dict:
    """`o17, 42` -> {"order": "o17", "amount": 42}: the compact format's comma-separated
    positional arguments, bare words allowed (the last parameter takes the rest of the text)."""
    names = list(chosen.parameters.get("properties", {}))
    parts = [p.strip() for p in raw.split(",", max(len(names) - 1, 0))] if raw.strip() else []
    if len(parts) != len(names):
        raise BadArguments(f"{chosen.name} takes {len(names)} argument(s): {', '.join(names)}")
    arguments: dict = {}
    for name, text in zip(names, parts):
        kind = chosen.parameters["properties"][name].get("type")
        if kind in ("number", "integer"):
            try:
                arguments[name] = float(text.lstrip("$"))
            except ValueError:
                raise BadArguments(f"{chosen.name}: {name} must be a number, got {text[:20]!r}") from None
        else:
            arguments[name] = text
    return arguments

