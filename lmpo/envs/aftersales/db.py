"""The company database: schema, generation from a seed, the read-only source and per-episode copies.

The source file is generated once per seed (atomically, so parallel runs can share it) and is
only ever opened read-only (`mode=ro` and `PRAGMA query_only`). Each episode works on its own
in-memory copy made with SQLite's online backup, so episodes never see each other's writes and
the source is never written.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import random
import re
import sqlite3
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL, email TEXT NOT NULL);
CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, price INTEGER NOT NULL);
CREATE TABLE orders (
    id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
    product_id INTEGER NOT NULL REFERENCES products(id), quantity INTEGER NOT NULL,
    amount INTEGER NOT NULL,                -- whole dollars: the tiny model reads short numbers
    status TEXT NOT NULL CHECK (status IN ('placed', 'shipped', 'delivered', 'cancelled')),
    ordered_on TEXT NOT NULL, ship_address TEXT NOT NULL);
CREATE TABLE shipments (
    order_id INTEGER PRIMARY KEY REFERENCES orders(id), carrier TEXT NOT NULL, tracking TEXT NOT NULL,
    shipped_on TEXT NOT NULL, eta TEXT NOT NULL, delivered_on TEXT);
CREATE TABLE refunds (
    id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL REFERENCES orders(id), amount INTEGER NOT NULL,
    issued_on TEXT NOT NULL, issued_by TEXT NOT NULL);
CREATE TABLE handoffs (
    id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL REFERENCES orders(id), reason TEXT NOT NULL,
    created_on TEXT NOT NULL);
CREATE TABLE policies (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE handbook (id TEXT PRIMARY KEY, title TEXT NOT NULL, text TEXT NOT NULL);
"""

FIRST = ["Ana", "Ben", "Cai", "Dee", "Eli", "Fay", "Gus", "Hal", "Ivy", "Jo", "Kim", "Lou", "Max", "Ned", "Oda"]
LAST = ["Lee", "Ito", "Ruiz", "Kahn", "Moss", "Diaz", "Park", "Ward", "Bell", "Cole"]
CITIES = ["Porto", "Lyon", "Graz", "Turin", "Gent", "Cork", "Bonn", "Brno"]
STREETS = ["Elm", "Oak", "Pine", "Main", "Lake", "Hill", "Park", "Mill", "Rose", "Bay"]
# Each amount an agent may refund alone ($12, 24, 36, 45, 90, 55, 64, 76, 87: the prices below times
# 1-3) has its own first digit. The tiny model copies a number's first digit from what it looked
# up and recalls the rest from the prices it has seen (measured: with $22 and $29 both on sale it
# refunded $29 for $22, and with 60 prices drawn per database it copied 6 amounts of 40).
PRODUCTS = [("mug", 12), ("cup", 12), ("lamp", 45), ("torch", 45), ("fan", 55), ("pan", 55), ("vase", 64),
            ("bowl", 64), ("clock", 76), ("radio", 76), ("rug", 87), ("towel", 87),
            ("shelf", 120), ("kettle", 150), ("mirror", 180), ("chair", 140), ("bike", 230), ("desk", 260)]
GENERATOR_VERSION = 2
"""Part of a source file's name: a change to `generate` must not reuse files the old one wrote."""
CARRIERS = ["UPX", "DHW", "GLS"]


@dataclass(frozen=True)
class Policies:
    """The rules the company gives its agents; stored in the database, quoted by the handbook."""

    refund_window_days: int = 9
    """Days after delivery a refund may be asked for; 9 so that a 1M-parameter model can read it (see task.py)."""
    approval_limit: int = 100
    """The largest refund an agent may issue without a human's approval, in dollars."""

    def handbook(self) -> list[dict[str, str]]:
        """Short documents the agent searches (`search_policy`); one per topic."""
        return [
            {"id": "refund", "title": "refund",
             "text": f"refund: {self.refund_window_days}d window, max ${self.approval_limit}, above: human"},
            {"id": "address", "title": "address", "text": "address: only before shipping"},
            {"id": "cancel", "title": "cancel", "text": "cancel: only before shipping"},
            {"id": "complaint", "title": "complaint", "text": "complaint: hand to a human"},
            {"id": "shipping", "title": "where shipping eta", "text": "where: tell the eta"},
        ]


@dataclass(frozen=True)
class Order:
    """One order as the agent's tools see it (joined with its shipment and refunds)."""

    id: int
    customer_id: int
    amount: int
    status: str
    ordered_on: str
    ship_address: str
    eta: str | None
    delivered_on: str | None
    refunded: int

    @property
    def ref(self) -> str:
        return f"o{self.id}"


def parse_order_ref(ref: str) -> int | None:
    """`o17` (or `17`) -> 17; None for anything else."""
    text = ref.strip().lower().removeprefix("o")
    return int(text) if re.fullmatch(r"[0-9]{1,8}", text) else None  # not str.isdigit: int() refuses '²'


def generate(path: Path, seed: int, policies: Policies, *, n_orders: int = 5000, today: str = "2026-06-30") -> None:
    """Write a fresh database for `seed` to `path` (which must not exist)."""
    rng = random.Random(f"aftersales-db:{seed}")
    day0 = dt.date.fromisoformat(today)
    db = sqlite3.connect(path)
    db.executescript(SCHEMA)
    db.executemany("INSERT INTO policies VALUES (?, ?)",
                   [("today", today), ("refund_window_days", str(policies.refund_window_days)),
                    ("approval_limit", str(policies.approval_limit))])
    db.executemany("INSERT INTO handbook VALUES (:id, :title, :text)", policies.handbook())
    customers = []
    for cid in range(1, 61):
        first, last = rng.choice(FIRST), rng.choice(LAST)
        customers.append((cid, f"{first} {last}", rng.choice(CITIES), f"{first.lower()}.{last.lower()}{cid}@mail.test"))
    db.executemany("INSERT INTO customers VALUES (?, ?, ?, ?)", customers)
    db.executemany("INSERT INTO products VALUES (?, ?, ?)", [(i + 1, n, p) for i, (n, p) in enumerate(PRODUCTS)])
    for oid in range(1, n_orders + 1):
        pid = rng.randrange(len(PRODUCTS))
        quantity = rng.choice([1, 1, 1, 2, 3])
        amount = PRODUCTS[pid][1] * quantity
        status = rng.choices(["placed", "shipped", "delivered", "cancelled"], [3, 3, 6, 1])[0]
        address = f"{rng.choice(STREETS)} {rng.randint(1, 99)}"
        if status == "delivered":
            delivered = day0 - dt.timedelta(days=rng.randint(1, 90))
            shipped = delivered - dt.timedelta(days=rng.randint(1, 5))
        elif status == "shipped":
            delivered, shipped = None, day0 - dt.timedelta(days=rng.randint(0, 3))
        else:
            delivered = shipped = None
        ordered = (shipped or day0 - dt.timedelta(days=rng.randint(0, 2))) - dt.timedelta(days=rng.randint(0, 2))
        db.execute("INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                   (oid, rng.randint(1, len(customers)), pid + 1, quantity, amount, status, ordered.isoformat(), address))
        if shipped is not None:
            eta = (delivered or day0 + dt.timedelta(days=rng.randint(1, 9))).isoformat()
            db.execute("INSERT INTO shipments VALUES (?, ?, ?, ?, ?, ?)",
                       (oid, rng.choice(CARRIERS), f"T{rng.randrange(10**6):06d}", shipped.isoformat(), eta,
                        delivered.isoformat() if delivered else None))
        if status == "delivered" and rng.random() < 0.08:  # some orders were refunded before
            db.execute("INSERT INTO refunds (order_id, amount, issued_on, issued_by) VALUES (?, ?, ?, 'staff')",
                       (oid, amount, delivered.isoformat()))
    db.commit()
    db.close()


def database_path(seed: int, policies: Policies, directory: str | os.PathLike | None = None,
                  n_orders: int = 5000) -> Path:
    """The source file for `seed`, `policies` and `n_orders`, generated on first use. Generation writes a
    temporary file and renames it into place, so runs sharing the directory never see half a file."""
    tag = hashlib.sha256(f"{seed}:{policies}:{n_orders}:{GENERATOR_VERSION}".encode()).hexdigest()[:12]
    folder = Path(directory or Path(tempfile.gettempdir()) / "lmpo-aftersales")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"company-{seed}-{tag}.sqlite"
    if not path.exists():
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".part")
        os.close(fd)
        os.unlink(tmp)
        generate(Path(tmp), seed, policies, n_orders=n_orders)
        os.replace(tmp, path)
    return path


def open_readonly(path: str | os.PathLike) -> sqlite3.Connection:
    """The source database, read-only: every write raises sqlite3.OperationalError."""
    db = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False)
    db.execute("PRAGMA query_only = ON")
    return db


_SOURCES: dict[str, sqlite3.Connection] = {}
_LOCK = threading.Lock()


def source(path: str | os.PathLike) -> sqlite3.Connection:
    """The shared read-only connection to the source at `path` (opened once per process)."""
    key = str(Path(path).resolve())
    with _LOCK:
        if key not in _SOURCES:
            _SOURCES[key] = open_readonly(key)
        return _SOURCES[key]


def episode_copy(path: str | os.PathLike) -> sqlite3.Connection:
    """A private in-memory copy of the source at `path` for one episode to read and write."""
    copy = sqlite3.connect(":memory:", check_same_thread=False)
    db = source(path)
    with _LOCK:
        db.backup(copy)
    return copy


def file_checksum(path: str | os.PathLike) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


_ORDER_SQL = ("SELECT o.id, o.customer_id, o.amount, o.status, o.ordered_on, o.ship_address, s.eta, s.delivered_on,"
              " COALESCE((SELECT SUM(r.amount) FROM refunds r WHERE r.order_id = o.id), 0)"
              " FROM orders o LEFT JOIN shipments s ON s.order_id = o.id")


def load_orders(db: sqlite3.Connection) -> list[Order]:
    return [Order(*row) for row in db.execute(f"{_ORDER_SQL} ORDER BY o.id").fetchall()]


def get_order(db: sqlite3.Connection, order_id: int) -> Order | None:
    row = db.execute(f"{_ORDER_SQL} WHERE o.id = ?", (order_id,)).fetchone()
    return Order(*row) if row else None


def policies_of(db: sqlite3.Connection) -> tuple[Policies, dt.date]:
    values = dict(db.execute("SELECT key, value FROM policies").fetchall())
    return (Policies(int(values["refund_window_days"]), int(values["approval_limit"])),
            dt.date.fromisoformat(values["today"]))


def render_order(order: Order, today: dt.date) -> str:
    """What `lookup_order` shows: short, with the facts a decision needs (age, eta, amount)."""
    if order.refunded:
        return f"{order.ref} refunded ${order.refunded}"
    if order.status == "delivered" and order.delivered_on:
        age = (today - dt.date.fromisoformat(order.delivered_on)).days
        return f"{order.ref} delivered {age}d ago ${order.amount}"
    if order.status == "shipped" and order.eta:
        days = (dt.date.fromisoformat(order.eta) - today).days
        return f"{order.ref} shipped eta {days}d ${order.amount}"
    return f"{order.ref} {order.status} ${order.amount}"
