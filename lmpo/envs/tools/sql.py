"""A read-only SQL tool over a SQLite file: one SELECT/WITH statement per call, a time limit,
a row cap and a compact text table as the observation.

Writes are stopped three times over: the statement must start with SELECT or WITH, an
authorizer denies every action but reading, and the file is opened with ``mode=ro``.
"""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from pathlib import Path

from lmpo.envs.tools.schema import Tool, ToolError, ToolTimeout, clip, tool

_LEADING_COMMENTS = re.compile(r"^(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*", re.DOTALL)
_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION,
                              getattr(sqlite3, "SQLITE_RECURSIVE", 33)})
_MAX_VALUE_BYTES = 1_000_000  # no string or blob above this: zeroblob(10**9) cannot exhaust memory
_PROGRESS_STEPS = 1000  # SQLite VM instructions between deadline checks
_MAX_COUNTED = 10_000  # rows past the cap counted for the "N more rows cut" line


class ReadOnlySQL:
    """One read-only connection to the SQLite file at `path`, safe to share between threads
    (queries run one at a time; each is bounded by `timeout_s`)."""

    def __init__(self, path: str | Path, *, timeout_s: float = 1.0, max_rows: int = 50, max_chars: int = 2000):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no SQLite database at {self.path}")
        if timeout_s <= 0 or max_rows < 1 or max_chars < 1:
            raise ValueError("timeout_s, max_rows and max_chars must be positive")
        self.timeout_s, self.max_rows, self.max_chars = timeout_s, max_rows, max_chars
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True,
                                     check_same_thread=False, isolation_level=None)
        self._conn.execute("PRAGMA query_only = ON")
        self._conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _MAX_VALUE_BYTES)
        self._conn.set_authorizer(_authorize)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ReadOnlySQL:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def schema_text(self) -> str:
        """The CREATE statements of the database's tables and views (for a prompt)."""
        return self.query("SELECT sql FROM sqlite_master WHERE type IN ('table', 'view') AND sql IS NOT NULL",
                          header=False)

    def query(self, sql: str, *, header: bool = True) -> str:
        """Run one SELECT/WITH statement and return a text table: a ``|``-separated header
        line, then at most `max_rows` rows and a line saying how many more were cut.
        Anything else or an SQL error raises ToolError; passing `timeout_s` raises ToolTimeout."""
        statement = _single_select(sql)
        with self._lock:
            deadline = time.monotonic() + self.timeout_s
            self._conn.set_progress_handler(lambda: int(time.monotonic() > deadline), _PROGRESS_STEPS)
            try:
                cursor = self._conn.execute(statement)
                rows = cursor.fetchmany(self.max_rows)
                columns = [column[0] for column in cursor.description or ()]
                more, counted = 0, True
                try:
                    while cursor.fetchone() is not None:
                        more += 1
                        if more >= _MAX_COUNTED:
                            counted = False
                            break
                except sqlite3.OperationalError:
                    counted = False  # the deadline passed while counting: the rows shown still stand
            except sqlite3.OperationalError as error:
                if "interrupted" in str(error):
                    raise ToolTimeout(f"timeout: the query ran past {self.timeout_s:g} s and was stopped") from None
                raise ToolError(f"sql error: {error}") from None
            except sqlite3.Error as error:
                raise ToolError(f"sql error: {error}") from None
            finally:
                self._conn.set_progress_handler(None, 0)
        lines = ["|".join(columns)] if header else []
        lines += ["|".join(_cell(value) for value in row) for row in rows]
        if not rows:
            lines.append("(no rows)")
        if more or not counted:
            lines.append(f"…[{more} more rows cut]" if counted else f"…[at least {max(more, 1)} more rows cut]")
        return clip("\n".join(lines), self.max_chars)


def _authorize(action: int, *_: object) -> int:
    return sqlite3.SQLITE_OK if action in _ALLOWED_ACTIONS else sqlite3.SQLITE_DENY


def _single_select(sql: str) -> str:
    if not isinstance(sql, str) or not sql.strip():
        raise ToolError("empty query: write one SELECT statement")
    statement = sql.strip().rstrip(";").rstrip()
    body = statement[_LEADING_COMMENTS.match(statement).end():]
    keyword = re.match(r"[A-Za-z]+", body)
    if keyword is None or keyword[0].upper() not in ("SELECT", "WITH"):
        found = keyword[0].upper() if keyword else clip(body, 20)
        raise ToolError(f"only a single SELECT (or WITH ... SELECT) statement is allowed, not {found}")
    if not sqlite3.complete_statement(statement + "\n;"):
        raise ToolError("incomplete SQL statement (unclosed quote, parenthesis or comment?)")
    return statement


def _cell(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        return clip(f"x'{value.hex()}'", 40)
    return str(value).replace("\n", "\\n")


def make_sql_tool(db: ReadOnlySQL, name: str = "sql") -> Tool:
    """The tool `name` with one parameter `query` that runs a read-only query on `db`."""

    def sql(query: str) -> str:
        """Run one read-only SQL SELECT query on the database and return the rows as a table.

        Args:
            query: A single SQLite SELECT (or WITH ... SELECT) statement.
        """
        return db.query(query)

    return tool(sql, name=name)
