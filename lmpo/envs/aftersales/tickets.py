"""Ticket kinds, their ground truth and the reference resolutions (for demonstrations and logs).

A ticket names one order. Its ground truth is the set of rows a correct agent writes (in the
verifier's change notation, see `verifier`) and the facts its final reply must contain; a
ticket that must go to a human has a hand-off as its only write and no reply.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass, field

from lmpo.envs.aftersales.db import STREETS, Order, Policies, render_order

KINDS = ("refund", "refund_late", "refund_big", "where", "addr", "addr_late", "cancel", "complaint")
COMPLAINTS = ("broken", "late", "rude", "wrong item", "dirty")
HANDOFF = "escalate_to_human"
# the handbook document that allows each write (the guardrail's third check)
POLICY_FOR = {"issue_refund": "refund", "update_address": "address", "cancel_order": "cancel"}


@dataclass(frozen=True)
class Ticket:
    kind: str
    prompt: str
    order: Order
    expected: tuple[tuple, ...]
    """The changes a correct resolution makes to the database, and nothing else."""
    facts: tuple[str, ...] = ()
    """What the final reply must state, as whole words (empty for a hand-off; see `verifier`)."""
    new_address: str = ""
    handoff: bool = False
    steps: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    """The reference resolution: ("call", "name(args)") or ("reply", text)."""


def reference_calls(ticket: Ticket) -> tuple[tuple[str, str], ...]:
    """The calls of the reference resolution as the tools log them: (tool, `o17` or a handbook document)."""
    calls = []
    for kind, text in ticket.steps:
        if kind == "call":
            name, arguments = text.split("(", 1)
            calls.append((name, arguments.rstrip(")").split(",")[0].strip()))
    return tuple(calls)


def age_days(order: Order, today: dt.date) -> int | None:
    return (today - dt.date.fromisoformat(order.delivered_on)).days if order.delivered_on else None


def kind_of_order(kind: str, order: Order, policies: Policies, today: dt.date) -> bool:
    """Whether `order` can carry a ticket of `kind` (the ground truth depends on the order's state)."""
    if order.refunded or order.status == "cancelled":
        return False
    age = age_days(order, today)
    small = order.amount <= policies.approval_limit
    recent = age is not None and age <= policies.refund_window_days
    delivered = order.status == "delivered" and age is not None
    return {"refund": delivered and recent and small,
            "refund_late": delivered and not recent and small,
            "refund_big": delivered and recent and not small,
            "where": order.status == "shipped" and order.eta is not None,
            "addr": order.status == "placed",
            "addr_late": order.status in ("shipped", "delivered"),
            "cancel": order.status == "placed",
            "complaint": order.status in ("shipped", "delivered")}[kind]


def make_ticket(kind: str, order: Order, policies: Policies, today: dt.date, rng: random.Random) -> Ticket:
    ref, amount = order.ref, order.amount
    look = ("call", f"lookup_order({ref})")
    escalate = ("call", f"{HANDOFF}({ref})")
    handoff = (("handoff", order.id),)
    if kind.startswith("refund"):
        steps = [look, ("call", "search_policy(refund)")]
        if kind == "refund":
            return Ticket(kind, f"refund {ref}", order, (("refund", order.id, amount),), (f"${amount}",),
                          steps=(*steps, ("call", f"issue_refund({ref}, {amount})"), ("reply", f"refunded ${amount}")))
        if kind == "refund_late":
            return Ticket(kind, f"refund {ref}", order, (), ("refused",), steps=(*steps, ("reply", "refused")))
        return Ticket(kind, f"refund {ref}", order, handoff, handoff=True, steps=(*steps, escalate))
    if kind == "where":
        eta = render_order(order, today).split()[3]
        return Ticket(kind, f"where {ref}", order, (), (f"eta {eta}",), steps=(look, ("reply", f"eta {eta}")))
    if kind.startswith("addr"):
        address = order.ship_address
        while address == order.ship_address:
            address = f"{rng.choice(STREETS)} {rng.randint(1, 99)}"
        steps = [look, ("call", "search_policy(address)")]
        if kind == "addr":
            return Ticket(kind, f"addr {ref} {address}", order, (("update", "orders", order.id, "ship_address", address),),
                          ("updated",), address,
                          steps=(*steps, ("call", f"update_address({ref}, {address})"), ("reply", "updated")))
        return Ticket(kind, f"addr {ref} {address}", order, (), ("refused",), address, steps=(*steps, ("reply", "refused")))
    if kind == "cancel":
        return Ticket(kind, f"cancel {ref}", order, (("update", "orders", order.id, "status", "cancelled"),),
                      ("cancelled",), steps=(look, ("call", "search_policy(cancel)"), ("call", f"cancel_order({ref})"),
                                             ("reply", "cancelled")))
    if kind == "complaint":
        return Ticket(kind, f"complaint {ref} {rng.choice(COMPLAINTS)}", order, handoff, handoff=True,
                      steps=(look, escalate))
    raise ValueError(f"unknown ticket kind {kind!r}; known: {', '.join(KINDS)}")


def flawed_steps(ticket: Ticket, read_policy: bool = True) -> tuple[tuple[str, str], ...]:
    """How a careless operator resolved the ticket: does what the customer asks whatever the
    order's state and the policy say, and with `read_policy=False` does not read the policy.

    Two flaws. Ignoring what the policy says is one the guardrail cannot see (the evidence is
    all there), so only the verifier's outcome teaches the model to act on what it read. Not
    reading it is one the guardrail blocks at run time (these logs predate the guardrail), so
    it shows as blocks that training should remove."""
    ref, amount = ticket.order.ref, ticket.order.amount
    look = ("call", f"lookup_order({ref})")
    if ticket.kind.startswith("refund"):
        policy, write, reply = "search_policy(refund)", f"issue_refund({ref}, {amount})", f"refunded ${amount}"
    elif ticket.kind.startswith("addr"):
        policy, write, reply = "search_policy(address)", f"update_address({ref}, {ticket.new_address})", "updated"
    else:
        return ticket.steps
    return (look, *([("call", policy)] if read_policy else []), ("call", write), ("reply", reply))


class TicketPool:
    """Orders of one database grouped by the ticket kinds they can carry."""

    def __init__(self, orders: list[Order], policies: Policies, today: dt.date, kinds: tuple[str, ...] = KINDS):
        self.policies, self.today = policies, today
        self.by_kind = {k: [o for o in orders if kind_of_order(k, o, policies, today)] for k in kinds}
        empty = [k for k, v in self.by_kind.items() if not v]
        if empty:
            raise ValueError(f"the database has no order for ticket kinds {empty}; generate more orders")

    def draw(self, kind: str, rng: random.Random) -> Ticket:
        return make_ticket(kind, rng.choice(self.by_kind[kind]), self.policies, self.today, rng)
