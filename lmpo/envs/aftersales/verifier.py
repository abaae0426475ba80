"""The verifier: the episode's database against the source, row by row, compared with the
ticket's ground truth; plus the facts the final reply must state.

Changes are written in one notation for ground truth and observed state alike:
`("refund", order_id, amount)`, `("handoff", order_id)`, `("update", table, rowid, column, value)`,
and for anything else `("insert" | "delete", table, rowid)`. A resolution is correct when the
changes are exactly the expected ones, counted row by row: a missing write fails, and so does
any extra write, a second identical refund row included.

A reply states a fact when the fact's words appear in it as whole words, not negated within
their clause ("$12" is not stated by "$120", "refused" is not stated by "not refused"). A reply
that states values the ticket's facts contradict (a second amount, another eta, a second
outcome) fails, so a reply listing every eta passes no `where` ticket.
"""

from __future__ import annotations

import re
import sqlite3
from collections import Counter
from dataclasses import dataclass


def _rows(db: sqlite3.Connection, table: str) -> tuple[list[str], dict[int, tuple]]:
    cursor = db.execute(f'SELECT rowid, * FROM "{table}"')
    columns = [c[0] for c in cursor.description][1:]
    return columns, {row[0]: row[1:] for row in cursor.fetchall()}


def changes(source: sqlite3.Connection, episode: sqlite3.Connection) -> list[tuple]:
    """Every difference between the two databases, in the notation above: one entry per row, so
    two identical refund rows are two entries (sorted, for people to read)."""
    tables = [r[0] for r in source.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    found: list[tuple] = []
    for table in tables:
        columns, before = _rows(source, table)
        _, after = _rows(episode, table)
        for rowid in after.keys() - before.keys():
            row = dict(zip(columns, after[rowid]))
            if table == "refunds":
                found.append(("refund", row["order_id"], row["amount"]))
            elif table == "handoffs":
                found.append(("handoff", row["order_id"]))
            else:
                found.append(("insert", table, rowid))
        for rowid in before.keys() - after.keys():
            found.append(("delete", table, rowid))
        for rowid in before.keys() & after.keys():
            for column, old, new in zip(columns, before[rowid], after[rowid]):
                if old != new:
                    found.append(("update", table, rowid, column, new))
    return sorted(found, key=str)


# -- the reply ---------------------------------------------------------------------------------------------
_TOKEN = re.compile(r"\$?[a-z0-9]+(?:[.'][a-z0-9]+)*")
_CLAUSE_END = re.compile(r"[,;:!?\n]|\.(?!\d)")
NEGATIONS = frozenset({"not", "no", "never", "isn't", "wasn't", "won't", "don't", "didn't", "can't", "cannot",
                       "without"})
SLOTS = {"amount": re.compile(r"\$\d+(?:\.\d+)?"), "days": re.compile(r"\d+d"),
         "outcome": re.compile(r"refused|refunded|updated|cancelled")}
"""What a reply can state one value of: the amount refunded, the eta, what was done."""


def _clauses(text: str) -> list[list[tuple[str, bool]]]:
    """The reply's words, clause by clause, each with whether a negation precedes it in its clause."""
    out = []
    for clause in _CLAUSE_END.split(text.lower()):
        words = _TOKEN.findall(clause)
        out.append([(w, any(n in NEGATIONS for n in words[max(0, i - 2):i])) for i, w in enumerate(words)])
    return out


def states(text: str, fact: str) -> bool:
    """`text` states `fact`: its words, in order, as whole words, not negated."""
    wanted = _TOKEN.findall(fact.lower())
    for clause in _clauses(text):
        for i in range(len(clause) - len(wanted) + 1):
            window = clause[i:i + len(wanted)]
            if wanted and [w for w, _ in window] == wanted and not any(negated for _, negated in window):
                return True
    return False


def claims(text: str) -> dict[str, set[str]]:
    """The values `text` states, slot by slot (negated words state nothing)."""
    found: dict[str, set[str]] = {}
    for clause in _clauses(text):
        for word, negated in clause:
            slot = next((s for s, shape in SLOTS.items() if shape.fullmatch(word)), None)
            if slot and not negated:
                found.setdefault(slot, set()).add(word)
    return found


def reply_states(reply: str | None, facts: tuple[str, ...]) -> bool:
    """Every fact stated, and no slot holding a value besides the facts' (or, for a slot the facts
    leave open, more than one value)."""
    if reply is None or not all(states(reply, fact) for fact in facts):
        return False
    required = claims(" ; ".join(facts))
    return all(values == required[slot] if slot in required else len(values) <= 1
               for slot, values in claims(reply).items())


@dataclass(frozen=True)
class Verdict:
    correct: bool
    database_ok: bool
    reply_ok: bool
    missing: tuple[tuple, ...] = ()
    extra: tuple[tuple, ...] = ()


def verify(expected, observed, facts: tuple[str, ...], reply: str | None, handoff: bool) -> Verdict:
    """`expected`, `observed`: changes (repeats count); `reply`: the final answer text (None when
    the episode ended without one, e.g. a hand-off)."""
    want, got = Counter(expected), Counter(observed)
    missing, extra = want - got, got - want
    database_ok = not missing and not extra
    reply_ok = True if handoff else reply_states(reply, facts)  # a hand-off: the human writes the reply
    return Verdict(database_ok and reply_ok, database_ok, reply_ok, tuple(sorted(missing.elements(), key=str)),
                   tuple(sorted(extra.elements(), key=str)))
