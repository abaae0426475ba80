"""The verifier: the episode's database against the source, row by row, compared with the
ticket's ground truth; plus the facts the final reply must state.

Changes are written in one notation for ground truth and observed state alike:
`("refund", order_id, amount)`, `("handoff", order_id)`, `("update", table, rowid, column, value)`,
and for anything else `("insert" | "delete", table, rowid)`. A resolution is correct when the
changes are exactly the expected ones: a missing write fails, and so does any extra write.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass


def _rows(db: sqlite3.Connection, table: str) -> tuple[list[str], dict[int, tuple]]:
    cursor = db.execute(f'SELECT rowid, * FROM "{table}"')
    columns = [c[0] for c in cursor.description][1:]
    return columns, {row[0]: row[1:] for row in cursor.fetchall()}


def changes(source: sqlite3.Connection, episode: sqlite3.Connection) -> set[tuple]:
    """Every difference between the two databases, in the notation above."""
    tables = [r[0] for r in source.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    found: set[tuple] = set()
    for table in tables:
        columns, before = _rows(source, table)
        _, after = _rows(episode, table)
        for rowid in after.keys() - before.keys():
            row = dict(zip(columns, after[rowid]))
            if table == "refunds":
                found.add(("refund", row["order_id"], row["amount"]))
            elif table == "handoffs":
                found.add(("handoff", row["order_id"]))
            else:
                found.add(("insert", table, rowid))
        for rowid in before.keys() - after.keys():
            found.add(("delete", table, rowid))
        for rowid in before.keys() & after.keys():
            for column, old, new in zip(columns, before[rowid], after[rowid]):
                if old != new:
                    found.add(("update", table, rowid, column, new))
    return found


@dataclass(frozen=True)
class Verdict:
    correct: bool
    database_ok: bool
    reply_ok: bool
    missing: tuple[tuple, ...] = ()
    extra: tuple[tuple, ...] = ()


def verify(expected: set[tuple], observed: set[tuple], facts: tuple[str, ...], reply: str | None,
           handoff: bool) -> Verdict:
    """`reply`: the final answer text (None when the episode ended without one, e.g. a hand-off)."""
    missing, extra = expected - observed, observed - expected
    database_ok = not missing and not extra
    if handoff:
        reply_ok = True  # a hand-off ends the episode: the human writes the reply
    else:
        text = (reply or "").lower()
        reply_ok = reply is not None and all(fact.lower() in text for fact in facts)
    return Verdict(database_ok and reply_ok, database_ok, reply_ok, tuple(sorted(missing, key=str)),
                   tuple(sorted(extra, key=str)))
