"""Read ``metrics.jsonl`` files and turn rows into plottable series."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

Row = dict[str, Any]
Series = tuple[list[float], list[float]]  # (steps, values), sorted by step


def refuse_non_file(path: Path) -> None:
    """A ValueError for a run's file that exists as something else (a directory, say): the report
    and the doctor said the run had no metrics.jsonl, or skipped its stage without a word."""
    if path.exists() and not path.is_file():
        kind = "a directory" if path.is_dir() else "not a regular file"
        raise ValueError(f"{path} is {kind}, where the run's {path.name} file belongs; move it aside")


def read_metrics(path: str | Path) -> list[Row]:
    """Read one JSON object per line from ``path``.

    Blank lines are ignored. A line that is not a JSON object (what a killed writer leaves as the
    last line, or a line damaged since) is skipped with a warning naming the file and line, so
    the report and the doctor read the rows around it.
    """
    path = Path(path)
    lines = path.read_bytes().splitlines()
    last = max((i for i, ln in enumerate(lines, 1) if ln.strip()), default=0)
    rows: list[Row] = []
    linenos: list[int] = []
    damaged: list[tuple[int, str]] = []
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            obj = _parse_line(raw)
        except ValueError as exc:
            if lineno == last:
                warnings.warn(
                    f"{path}: line {lineno}: skipping truncated last line ({exc})",
                    RuntimeWarning,
                    stacklevel=2,
                )
            else:
                damaged.append((lineno, str(exc)))
            continue
        if not isinstance(obj, dict):
            damaged.append((lineno, f"expected a JSON object, got {type(obj).__name__}"))
            continue
        rows.append(obj)
        linenos.append(lineno)
    if damaged:  # one warning, not one per line: a file damaged throughout may have 100k lines
        lineno, reason = damaged[0]
        extra = len(damaged) - 1
        more = f" (and {extra} more damaged line{'s' if extra > 1 else ''})" if extra else ""
        warnings.warn(f"{path}: line {lineno}: skipping damaged line ({reason}){more}; the report and the "
                      f"doctor read the other {len(rows)} rows", RuntimeWarning, stacklevel=2)
    _warn_wrong_types(path, rows, linenos)
    return rows


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _warn_wrong_types(path: Path, rows: list[Row], linenos: list[int]) -> None:
    """One warning for values of a field that other rows log as numbers (or that is always a
    number: `step`, the held-out `eval_*` figures) but this row does not (a hand-edited "0.5" or
    true): the plots and the doctor read numbers only."""
    numeric: set[str] = set()
    others = []  # one pass: a metrics file may have 100k rows
    for lineno, row in zip(linenos, rows):
        for key, value in row.items():
            if _is_number(value):
                numeric.add(key)
            elif value is not None:
                others.append((lineno, key, value))
    odd = [(lineno, key, value) for lineno, key, value in others
           if key in numeric or key == "step" or key.startswith("eval_")]
    if not odd:
        return
    lineno, key, value = odd[0]
    more = f" (and {len(odd) - 1} more such values)" if len(odd) > 1 else ""
    kind = {bool: "a boolean", str: "a string", list: "a list", dict: "an object"}.get(type(value), type(value).__name__)
    warnings.warn(f"{path}: line {lineno}: {key!r} is {kind} ({json.dumps(value)[:40]}) where a number "
                  f"belongs; the report and the doctor read numbers only{more}", RuntimeWarning, stacklevel=3)


def _parse_line(raw: bytes) -> Any:
    """Decode and parse one line; raise ``ValueError`` with a short reason."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"invalid UTF-8 ({exc.reason})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(json_error(exc, f"column {exc.colno}")) from None


def json_error(exc: json.JSONDecodeError, where: str) -> str:
    """The parser's reason and ``where`` (its messages such as "Unterminated string starting at"
    end with "at" already)."""
    return f"invalid JSON: {exc.msg.removesuffix(' at')} at {where}"


def as_float(value: Any) -> float | None:
    """Return ``value`` as a float if it is a JSON number (or bool), else None."""
    if isinstance(value, (bool, int, float)):
        return float(value)
    return None


def row_step(row: Row, index: int) -> float:
    """The row's ``step``, falling back to its position in the file."""
    step = as_float(row.get("step"))
    return step if step is not None and math.isfinite(step) else float(index)


# Shares of one whole (why episodes ended) that a trainer logs only when not 0: in a row that
# has some key of a family, a missing key of the same family is a share of 0, not a gap.
SHARE_PREFIXES = ("termination_", "eval_termination_")


def kept_rows(rows: list[Row]) -> list[Row]:
    """The rows the report and the doctor read: those of the run that was kept
    (:func:`final_branch`), with unlogged shares filled in as 0 (:func:`with_zero_shares`)."""
    return with_zero_shares(final_branch(rows))


def final_branch(rows: list[Row]) -> list[Row]:
    """Without the rows a collapse-guard rollback abandoned: a rollback row (`to_step`) undoes
    every earlier row of a later step, whose step is then trained and logged again; without this,
    a key the kept run did not log at a step was read from the abandoned one. Rollback rows stay
    (the doctor reports them; `rollbacks.without_rollbacks` keeps them off the curves)."""
    limit, kept = math.inf, []
    for row in reversed(rows):  # a rollback undoes what came before it, up to an earlier rollback's own limit
        step = as_float(row.get("step"))
        if "rollback" in row:
            to_step = as_float(row.get("to_step"))
            limit = min(limit, to_step) if to_step is not None else limit
            kept.append(row)
        elif step is None or step <= limit:
            kept.append(row)
    return kept[::-1]


def with_zero_shares(rows: list[Row]) -> list[Row]:
    """Each row that logs some share of a :data:`SHARE_PREFIXES` family, with the family's other
    keys seen in the run as 0 (`termination_answered` missing where every episode hit the token
    budget: the table's minimum, the curves and the doctor read 0 there, not "not measured")."""
    families = {p: [k for k in dict.fromkeys(k for r in rows for k in r) if k.startswith(p)] for p in SHARE_PREFIXES}
    out = []
    for row in rows:
        missing = {k: 0.0 for p, keys in families.items() if any(k.startswith(p) for k in row)
                   for k in keys if k not in row}
        out.append({**row, **missing} if missing else row)
    return out


def numeric_keys(rows: list[Row]) -> list[str]:
    """Keys (other than ``step``) holding a number in at least one row."""
    seen: dict[str, None] = {}
    for row in rows:
        for key, value in row.items():
            if key != "step" and key not in seen and as_float(value) is not None:
                seen[key] = None
    return list(seen)


def series(rows: list[Row], key: str) -> Series:
    """Finite ``(step, value)`` points for ``key``, sorted by step.

    If a step appears twice (e.g. a resumed run re-logging a step), the later
    row wins.
    """
    points: dict[float, float] = {}
    for index, row in enumerate(rows):
        value = as_float(row.get(key))
        if value is not None and math.isfinite(value):
            points[row_step(row, index)] = value
    steps = sorted(points)
    return steps, [points[s] for s in steps]


def all_series(rows: list[Row]) -> dict[str, Series]:
    """Every numeric key with at least one finite point: `series` of each, in the order of
    `numeric_keys`, from one pass over the rows."""
    points: dict[str, dict[float, float]] = {}
    for index, row in enumerate(rows):
        step = row_step(row, index)
        for key, value in row.items():
            if key == "step" or not isinstance(value, (bool, int, float)):
                continue
            line = points.setdefault(key, {})
            if math.isfinite(value):
                line[step] = float(value)
    out: dict[str, Series] = {}
    for key, line in points.items():
        if line:
            steps = sorted(line)
            out[key] = (steps, [line[s] for s in steps])
    return out


def nonfinite_points(rows: list[Row], data: dict[str, Series]) -> dict[str, list[tuple[float, float]]]:
    """Per key, the (step, value) of each NaN or ±inf logged at a step where ``data`` (the finite
    series) has no point: what the curves leave out, which a report must say (a diverged run
    otherwise looks flat and healthy)."""
    out: dict[str, dict[float, float]] = {}
    for index, row in enumerate(rows):
        for key, value in row.items():
            if key != "step" and isinstance(value, float) and not math.isfinite(value):
                out.setdefault(key, {})[row_step(row, index)] = value
    found = {}
    for key, points in out.items():
        finite = set(data.get(key, ((), ()))[0])
        if (left_out := sorted((s, v) for s, v in points.items() if s not in finite)):
            found[key] = left_out
    return found


def ema(values: list[float], span: float | None = None) -> list[float]:
    """Exponential moving average; by default the span scales with length."""
    if span is None:
        span = min(max(len(values) / 20.0, 1.0), 50.0)
    alpha = 2.0 / (span + 1.0)
    out: list[float] = []
    state: float | None = None
    for v in values:
        state = v if state is None else alpha * v + (1.0 - alpha) * state
        out.append(state)
    return out


def align(data: Series, steps: list[float], fill: float = 0.0) -> list[float]:
    """Values of ``data`` at ``steps``, with ``fill`` where a step is missing."""
    lookup = dict(zip(*data))
    return [lookup.get(s, fill) for s in steps]
