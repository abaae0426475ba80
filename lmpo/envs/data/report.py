"""What a loader did with a file: its shape and what the over-long policy dropped or cut."""

from __future__ import annotations

import re
import sys
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Generic, Literal, TypeVar, get_args

from lmpo.envs.data.records import DataError, LoadProgress, Record, ShapeCheck, read_records
from lmpo.envs.data.unknown import Unknown, counting_unknown

Overlong = Literal["error", "skip", "truncate"]
NO_LIMIT = sys.maxsize
"""`max_length` for examples of any length (CPT's documents by default)."""
T = TypeVar("T")


@dataclass
class LoadReport:
    """`rows` read; `kept` examples returned; `skipped_overlong` dropped for length (with
    overlong="skip", or cut by "truncate" until no loss token was left); `truncated` kept
    but cut to `max_length`. `shape_field` is the field that decided `shape`."""

    path: str
    shape: str
    rows: int
    kept: int
    skipped_overlong: int
    truncated: int
    shape_field: str = ""
    max_length: int = 0
    overlong: str = "error"
    limit_name: str = ""
    """How messages name the length limit when it is not the `max_length` option (the model's context)."""
    unknown: Unknown = field(default_factory=Unknown)
    """The tokenizer's unknown tokens among the examples' tokens (text it cannot represent)."""

    @property
    def limit(self) -> str:
        return self.limit_name or f"max_length {self.max_length}"

    def summary(self) -> str:
        decided = f" (field '{self.shape_field}')" if self.shape_field else ""
        unknown = self.unknown.summary()
        if self.max_length >= NO_LIMIT and not self.limit_name:
            over = "no length limit"
        elif self.overlong == "error":  # a trainer stops at the first; `lmpo data` counts them all
            n = self.skipped_overlong
            over = f"over {self.limit}: {n} row{'s' * (n != 1)}" if n else f"over {self.limit}: none"
        else:
            over = f"over {self.limit} ({self.overlong}): {self.skipped_overlong} skipped, {self.truncated} truncated"
        return (f"{self.path}: {self.rows} rows, shape '{self.shape}'{decided}, kept {self.kept}; {over}"
                + (f"\n  warning: {unknown}; the model never sees it" if unknown else ""))


@dataclass(frozen=True)
class RowFormat(Generic[T]):
    """How one kind of loader reads a row: its shape, the fewest tokens it can make before
    tokenizing (None when it may fit; from the fields its shape renders), its tokenized example, that example's length, and the
    example cut to a length (None when nothing worth training on is left)."""

    shape: Callable[[Record], tuple[str, str]]
    least_tokens: Callable[[Record, str, int, Any], int | None]
    tokenize: Callable[[Record, str, Any], T]
    length: Callable[[T], int]
    truncate: Callable[[T, int], T | None]
    fields: Callable[[str, T], tuple[str, ...]] | None = None
    """The fields a row of a shape renders into its example's length, which an over-long row's
    error names (`prompt` + `completion`); None: the field that decided the shape."""


def load_rows(path: str | Path, tokenizer, max_length: int, overlong: Overlong,
              fmt: RowFormat[T], limit_name: str = "",
              columns: Callable[[Record], Record] | None = None) -> tuple[list[T], LoadReport]:
    """Every row of `path` read as `fmt` says, one shape for all rows, examples over
    `max_length` handled by the `overlong` policy; the examples and what was done to get them.
    `limit_name` names the limit in messages when it is not the option `max_length` (e.g. "the
    model's context of 256 tokens"). `columns` renames a row's columns before it is read."""
    check_options(max_length, overlong)
    records = read_records(path)
    shapes = ShapeCheck()
    report = LoadReport(str(path), "", len(records), 0, 0, 0, max_length=max_length, overlong=overlong,
                        limit_name=limit_name)
    examples = []
    progress = LoadProgress(str(path), "tokenizing", len(records), "rows")
    with counting_unknown(tokenizer) as report.unknown:
        for done, rec in enumerate(records):
            if done % 1024 == 0:
                progress.update(done)
            example = _example(columns(rec) if columns else rec, tokenizer, max_length, overlong, fmt, shapes, report)
            if example is not None:
                examples.append(example)
    report.shape, report.shape_field, report.kept = shapes.shape or "", shapes.field, len(examples)
    return examples, finish(report)


def _example(rec: Record, tokenizer, max_length: int, overlong: Overlong, fmt: RowFormat[T], shapes: ShapeCheck,
             report: LoadReport) -> T | None:
    """One row's example under the overlong policy (None: skipped), counted in `report`."""
    shape, shape_field = fmt.shape(rec)
    shapes.check(rec, shape, rec.named(shape_field))
    least = fmt.least_tokens(rec, shape, max_length, tokenizer)
    if least is not None and overlong != "truncate":
        if overlong == "error":
            raise overlong_before_tokenizing(rec, least, report.limit)
        report.skipped_overlong += 1
        return None
    if least is not None:  # truncated anyway: tokenize no more of a 50 MB text than can be kept
        rec = replace(rec, fields=_cut_strings(rec.fields, (max_length + 16) * longest_token_chars(tokenizer)))
    unknown_before = report.unknown.tokens
    example = fmt.tokenize(rec, shape, tokenizer)
    report.unknown.row(rec.place, unknown_before)
    length = fmt.length(example)
    if length > max_length:
        if overlong == "error":
            raise overlong_error(rec, shape_field, length, report.limit, fmt.fields(shape, example) if fmt.fields else ())
        example = fmt.truncate(example, max_length) if overlong == "truncate" else None
        if example is None:
            report.skipped_overlong += 1
            return None
        report.truncated += 1
    return example


def check_options(max_length: int, overlong: str) -> None:
    if max_length < 1:
        raise ValueError(f"max_length must be at least 1, got {max_length}")
    if overlong not in get_args(Overlong):
        raise ValueError(f"overlong must be one of {', '.join(get_args(Overlong))}, got {overlong!r}")


def overlong_error(rec: Record, field: str, length: int, limit: str, fields: tuple[str, ...] = ()) -> DataError:
    """`fields`: those the row's length adds up (the row's own among them), named together where
    there are several, so a short prompt is not blamed for a long completion."""
    present = [f for f in fields if rec.get(f) is not None]
    if len(present) < 2:
        return DataError(rec.path, f"{length} tokens, over {limit} ({_remedies(limit)})", row=rec.row, line=rec.line,
                         field=rec.named(present[0] if present else field))
    named = " + ".join(f"'{rec.named(f)}' ({text_chars(rec.get(f))} characters)" for f in present)
    return DataError(rec.path, f"fields {named}: {length} tokens together, over {limit} ({_remedies(limit)})",
                     row=rec.row, line=rec.line)


ON_COMMAND_LINE: ContextVar[bool] = ContextVar("lmpo_on_command_line", default=False)
"""Set by `lmpo`'s main: messages name the flags alone, not also the Python arguments."""


def _remedies(limit: str) -> str:
    """What lets such a row load: a larger --max_length where the limit is that option ("max_length
    1024", not the model's context), or the overlong policy (truncate cuts a row too long to
    tokenize whole as well, and skips one it cannot cut)."""
    option = re.fullmatch(r"(\w*max_length) \d+", limit)
    larger = f"a larger --{option[1]}, or " if option else ""
    python = "" if ON_COMMAND_LINE.get() else ", overlong='skip' or 'truncate' from Python"
    return f"pass {larger}--overlong skip or --overlong truncate{python}, to load such rows"


def finish(report: LoadReport) -> LoadReport:
    """Refuses a file that yields nothing to train on."""
    if report.rows == 0:
        raise DataError(report.path, "no rows")
    if report.kept == 0:
        cut = (", and truncation left nothing to learn from in any (a reply cut to nothing, or two replies cut "
               "to the same tokens)" if report.overlong == "truncate" else "")
        policy = f"--overlong {report.overlong}" if ON_COMMAND_LINE.get() else f"overlong='{report.overlong}'"
        raise DataError(report.path, f"no examples left: all {report.rows} rows are over {report.limit} "
                                     f"({policy}){cut}")
    return report


def longest_token_chars(tokenizer) -> int:
    """The most characters one token of `tokenizer` can stand for (the longest vocabulary
    entry): a text of C characters has at least C / this many tokens."""
    cached = getattr(tokenizer, "_lmpo_longest_token_chars", None)
    if cached is None:
        try:
            cached = max((len(t) for t in tokenizer.get_vocab()), default=1) or 1
        except (AttributeError, TypeError, NotImplementedError):
            cached = 0  # unknown: no early check
        try:
            tokenizer._lmpo_longest_token_chars = cached
        except AttributeError:
            pass
    return cached


def text_chars(value) -> int:
    """Characters of every string in a field's value (strings, message lists, nested objects)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(text_chars(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(text_chars(v) for v in value)
    return 0


def certainly_overlong(rec: Record, fields, max_tokens: int, tokenizer) -> int | None:
    """Before tokenizing (which takes minutes, or all memory, for a 50 MB row): the fewest
    tokens the row's `fields` can make, when that alone is over `max_tokens`; else None."""
    per_token = longest_token_chars(tokenizer)
    if not per_token:
        return None
    chars = sum(text_chars(rec.get(f)) for f in fields)
    least = -(-chars // per_token)
    return least if least > max_tokens else None


def overlong_before_tokenizing(rec: Record, least: int, limit: str) -> DataError:
    """Names the row's longest field, where the text that makes it over the limit is."""
    field = max(rec.fields, key=lambda name: text_chars(rec.fields[name]))
    return DataError(rec.path, f"at least {least} tokens ({text_chars(rec.get(field))} characters in this field), "
                               f"over {limit}; rejected before tokenizing ({_remedies(limit)})",
                     row=rec.row, line=rec.line, field=rec.named(field))


def _cut_strings(value, chars: int):
    """`value` with every string longer than `chars` cut to its first `chars` (within messages
    and nested objects too): what truncation keeps of a row is the start of its text, so the
    tokens kept come out the same, and the rest is never tokenized."""
    if isinstance(value, str):
        return value[:chars]
    if isinstance(value, dict):
        return {key: _cut_strings(item, chars) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_cut_strings(item, chars) for item in value]
    return value
