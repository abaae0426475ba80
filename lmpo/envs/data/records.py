"""Reading users' data files into rows, and the error every loader raises for a bad row."""

from __future__ import annotations

import contextlib
import errno
import importlib
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

SUPPORTED = (".jsonl, .json (an array of rows, or JSON Lines), .parquet, .csv or .tsv (a header row; every value "
             "text), each but .parquet also compressed (.gz, .bz2, .xz), or a directory saved with datasets' "
             "save_to_disk ('dir::split' for a DatasetDict)")
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # the JSON escapes of UTF-16 surrogates, paired or not
SURROGATE = re.compile("[\ud800-\udfff]")  # in a decoded string only a lone one: json.loads joins a pair
COMPRESSED = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma"}  # read through the standard library's module


class DataError(ValueError):
    """A file or row that cannot be loaded. The message names the file, then the 1-based row
    and the field when they are known: `data/train.jsonl: row 17: field 'messages': expected ...`
    (`data/train.csv: line 18 (row 17): ...` where the file's line is another number).
    The same parts are kept as `path`, `row`, `line` and `field` for callers."""

    def __init__(self, path: str | Path, message: str, *, row: int | None = None, field: str | None = None,
                 line: int | None = None):
        self.path, self.row, self.field, self.line = str(path), row, field, line
        parts = [self.path]
        if row is not None:
            parts.append(row_place(row, line))
        if field is not None:
            parts.append(f"field '{field}'")
        super().__init__(": ".join([*parts, message]))


def type_name(value: Any) -> str:
    """A value's type as a user writing JSON would call it."""
    if value is None:
        return "null"
    return {dict: "object", list: "list", str: "str", bool: "bool", int: "int", float: "float"}.get(
        type(value), type(value).__name__)


def short_repr(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def row_place(row: int, line: int | None) -> str:
    """`row 17`, or `line 18 (row 17)` where the file's line differs from the row's number (a CSV
    file's header comes first), so an editor's line number finds it."""
    return f"line {line} (row {row})" if line is not None and line != row else f"row {row}"


@dataclass(frozen=True)
class Record:
    """One row of a data file: its user fields and where it came from. `row` is the line
    number in a JSONL file (blank lines are skipped but counted) and the 1-based index in
    Parquet files and saved datasets."""

    path: str
    row: int
    fields: dict[str, Any]
    aliases: dict[str, str] = field(default_factory=dict)
    """A renamed field's column in the file (`prompt` → `question`), so messages name the file's."""
    line: int | None = None
    """The file line the row starts on, where it is not `row` (CSV and TSV: the header is line 1)."""

    @property
    def place(self) -> str:
        return row_place(self.row, self.line)

    def get(self, name: str) -> Any:
        """The field's value; None when it is absent or null (Parquet and datasets fill
        columns a row lacks with nulls, so the two must mean the same)."""
        return self.fields.get(name)

    def renamed(self, columns: dict[str, str]) -> "Record":
        """The row with the file's columns read under other names ({column: name}); a column that
        already has one of the new names is left out (the option named another one)."""
        targets = set(columns.values())
        fields = {columns.get(k, k): v for k, v in self.fields.items() if k in columns or k not in targets}
        return Record(self.path, self.row, fields, {**self.aliases, **{v: k for k, v in columns.items()}}, self.line)

    def named(self, where: str | None) -> str | None:
        """A field path (`prompt`, `prompt[0].content`) with the file's name for a renamed field."""
        if not where or not self.aliases:
            return where
        head = re.match(r"[^\[.]+", where)
        return self.aliases.get(head[0], head[0]) + where[head.end():] if head else where

    def error(self, field: str | None, expected: str, got: str) -> DataError:
        return DataError(self.path, f"expected {expected}, got {got}", row=self.row, field=self.named(field),
                         line=self.line)

    def present(self) -> str:
        """The names of the row's non-null fields, for messages."""
        return ", ".join(self.named(k) for k, v in self.fields.items() if v is not None) or "none"

    def missing(self, field: str, expected: str) -> DataError:
        if field in self.fields:  # there, but null (a JSON null, or a Parquet row without the column)
            return self.error(field, expected, f"null (the row's other fields: {self.present()})")
        return self.error(field, expected, f"no such field (the row has: {self.present()}){self.rows_inside()}")

    def rows_inside(self) -> str:
        """A hint for a file that is one object holding the rows under a key (`{"data": [...]}`),
        which reads as a single row with that one field."""
        if self.row != 1 or len(self.fields) != 1 or not self.path.endswith(".json"):
            return ""
        (key, value), = self.fields.items()
        if not isinstance(value, list) or not value or not all(isinstance(v, dict) for v in value):
            return ""
        return (f"; if the file is one object holding its rows under {key!r} (a list of {len(value)} objects), "
                f"give that list itself as the file (a JSON array, or one object per line)")

    def refuse_lone_surrogates(self, where: str, value: Any) -> None:
        """Refuse `value`, parsed from JSON text in the row's field `where` (tool calls' arguments,
        tool schemas), if it holds a lone UTF-16 surrogate, as the readers refuse one in a row."""
        _refuse_lone_surrogates(self.path, self.row, value, self.named(where))

    def require_str(self, field: str) -> str:
        """A non-empty string field."""
        value = self.get(field)
        if value is None:
            raise self.missing(field, "a non-empty string")
        if not isinstance(value, str):
            raise self.error(field, "a non-empty string", type_name(value))
        if not value:
            raise self.error(field, "a non-empty string", "''")
        return value


class ShapeCheck:
    """The first row decides a dataset's shape; every later row must share it."""

    def __init__(self) -> None:
        self.shape: str | None = None
        self.field = ""
        self.place = ""

    def check(self, rec: Record, shape: str, field: str) -> None:
        if self.shape is None:
            self.shape, self.field, self.place = shape, field, rec.place
        elif shape != self.shape:
            raise rec.error(field, f"every row in the shape '{self.shape}' of {self.place} "
                                   f"(decided by field '{self.field}')", f"a row of shape '{shape}'")


def read_records(path: str | Path) -> list[Record]:
    """The rows of a `.jsonl` file (one JSON object per line), a `.json` file (an array of them,
    or JSON Lines), a `.parquet` file, or a directory written by `datasets` `save_to_disk`. A
    saved DatasetDict needs its split named as `dir::split`. Raises DataError for anything
    unreadable."""
    label = str(path)
    base, sep, split = label.rpartition("::")
    if sep and Path(base).is_dir():
        return _read_saved_dataset(Path(base), split, label)
    p = Path(label)
    if p.is_dir():
        return _read_saved_dataset(p, None, label)
    if not p.exists():
        raise DataError(label, _why_missing(p))
    suffix = p.suffix.lower()
    if suffix in COMPRESSED:
        suffix = Path(p.stem).suffix.lower()
        if suffix not in (".jsonl", ".json", ".csv", ".tsv"):
            raise DataError(label, f"unsupported file type '{suffix or p.name}' inside the {p.suffix} file; "
                                   f"supported: {SUPPORTED}")
    if suffix == ".jsonl":
        return _read_jsonl(p, label)
    if suffix == ".json":
        return _read_json(p, label)
    if suffix == ".parquet":
        return _read_parquet(p, label)
    if suffix in (".csv", ".tsv"):
        from lmpo.envs.data.csv_records import read_csv  # it reads rows with this module's helpers

        return read_csv(p, label, "\t" if suffix == ".tsv" else ",")
    raise DataError(label, f"unsupported file type '{suffix or p.name}'; supported: {SUPPORTED}")


def _why_missing(p: Path) -> str:
    """A name `ls` lists may still not open: say a symlink loop or a broken symlink as such."""
    try:
        os.stat(p)
    except OSError as err:
        if err.errno == errno.ELOOP:
            return "a symlink loop (too many levels of symbolic links)"
        if p.is_symlink():
            return f"a broken symlink (to {os.readlink(p)}, which does not exist)"
    return "no such file or directory"


class LoadProgress:
    """A line on stderr every `every_s` seconds of a long load (`[data] FILE: what, done of
    total unit`); nothing for a load that ends sooner."""

    def __init__(self, label: str, what: str, total: int, unit: str, every_s: float = 10.0):
        self.label, self.what, self.total, self.unit, self.every_s = label, what, total, unit, every_s
        self.shown = time.monotonic()

    def update(self, done: int) -> None:
        now = time.monotonic()
        if now - self.shown >= self.every_s:
            self.shown = now
            print(f"[data] {self.label}: {self.what}, {done:,} of {self.total:,} {self.unit}", file=sys.stderr,
                  flush=True)


@contextlib.contextmanager
def _open(path: Path, label: str):
    """(the file's bytes as a binary stream, decompressed for .gz/.bz2/.xz; a function giving how
    far into the file on disk reading is, for progress)."""
    with path.open("rb") as raw:
        module = COMPRESSED.get(path.suffix.lower())
        if module is None:
            yield raw, raw.tell
            return
        codec = importlib.import_module(module)
        try:
            with codec.open(raw) as stream:  # gzip.open, bz2.open, lzma.open
                yield stream, raw.tell
        except DataError:
            raise
        except (OSError, EOFError, getattr(codec, "LZMAError", OSError)) as e:  # gzip.BadGzipFile is an OSError
            raise DataError(label, f"cannot decompress the {path.suffix} file: {e}") from None


def _read_bytes(path: Path, label: str, size: int = -1) -> bytes:
    """The file's first `size` bytes (all of them by default), decompressed."""
    with _open(path, label) as (stream, _):
        return stream.read(size)


def _read_jsonl(path: Path, label: str) -> list[Record]:
    records = []
    progress = LoadProgress(label, "reading", path.stat().st_size >> 20, "MB")
    with _open(path, label) as (f, position):
        for line_no, raw in enumerate(f, start=1):
            if line_no % 4096 == 0:
                progress.update(position() >> 20)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(label, _not_utf8(e, raw if line_no == 1 else b"", path), row=line_no) from None
            if line_no == 1:
                line = line.removeprefix("\ufeff")
            if not line.strip():
                continue
            # a first row opening with `[`: the file is likely one JSON array, which JSON Lines is not
            hint = _array_hint(path) if not records and line.lstrip().startswith("[") else ""
            try:
                value = json.loads(line.rstrip("\r\n"))  # so that an error's column is in this row
            except json.JSONDecodeError as e:
                raise DataError(label, f"not valid JSON ({e.msg.removesuffix(' at')} at column {e.colno}){hint}",  # "starting at"
                                row=line_no) from None
            if not isinstance(value, dict):
                raise DataError(label, f"expected a JSON object, got {type_name(value)}{hint}", row=line_no)
            if SURROGATE_ESCAPE.search(raw):
                _refuse_lone_surrogates(label, line_no, value)
            records.append(Record(label, line_no, value))
    return records


def _array_hint(path: Path) -> str:
    compressed = path.suffix if path.suffix.lower() in COMPRESSED else ""
    stem = path.name[: len(path.name) - len(compressed)]
    name = stem.rsplit(".", 1)[0] + ".json" + compressed
    return (f"; the file looks like one JSON array, not JSON Lines (one object per line): name it {name!r} to "
            "read it as one")


def _not_utf8(err: UnicodeDecodeError, start: bytes, path: Path | None = None) -> str:
    """The decoding error, and what to do when the file is UTF-16 (Windows' "Unicode" text), or
    gzip-compressed under a name without `.gz`."""
    message = f"not valid UTF-8 ({err.reason} at byte {err.start})"
    if start.startswith(b"\x1f\x8b"):
        name = f"{path.name}.gz" if path is not None else "FILE.gz"
        return (f"{message}; the file is gzip-compressed (it starts with gzip's bytes 1f 8b) and its name does not "
                f"end in .gz: name it {name!r} and lmpo decompresses it as it reads")
    if start.startswith((b"\xff\xfe", b"\xfe\xff")):
        message += ("; the file is UTF-16 (it starts with a UTF-16 byte-order mark), and lmpo reads UTF-8: "
                    "save it as UTF-8, e.g. `iconv -f UTF-16 -t UTF-8 FILE > NEW`")
    return message


def _read_json(path: Path, label: str) -> list[Record]:
    """A `.json` file: a JSON array of row objects (Alpaca's and LLaMA-Factory's datasets), row N
    its Nth element; or JSON Lines under that name, as `datasets` reads either."""
    head = _read_bytes(path, label, 64).decode("utf-8", "replace").lstrip("\ufeff \t\r\n")
    if not head.startswith("["):
        try:
            return _read_jsonl(path, label)
        except DataError as jsonl_error:
            try:  # one object over several lines (pretty-printed), its rows perhaps under a key
                whole = json.loads(_read_bytes(path, label).decode("utf-8").removeprefix("\ufeff"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                raise jsonl_error from None
            lists = [key for key, v in whole.items() if isinstance(v, list)] if isinstance(whole, dict) else []
            hint = f" (its rows may be the list under {', '.join(map(repr, lists))})" if lists else ""
            raise DataError(label, f"holds one JSON {type_name(whole)}; expected an array of row objects, or one "
                                   f"object per line{hint}") from None
    data = _read_bytes(path, label)
    try:
        value = json.loads(data.decode("utf-8").removeprefix("\ufeff"))
    except UnicodeDecodeError as e:
        raise DataError(label, _not_utf8(e, data[:2], path)) from None
    except json.JSONDecodeError as e:
        raise DataError(label, f"not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    escapes = SURROGATE_ESCAPE.search(data)
    for i, row in enumerate(value, start=1):
        if not isinstance(row, dict):
            raise DataError(label, f"expected a JSON object, got {type_name(row)}", row=i)
        if escapes:
            _refuse_lone_surrogates(label, i, row)
    return [Record(label, i, row) for i, row in enumerate(value, start=1)]


def _refuse_lone_surrogates(label: str, row: int, value: Any, where: str = "") -> None:
    """A DataError for the first string in a row's `value` (at field path `where`) holding a lone
    UTF-16 surrogate, which JSON's escapes can write (`"\\ud800"`) and no tokenizer encodes."""
    if isinstance(value, str) and SURROGATE.search(value):
        raise DataError(label, _not_unicode(value), row=row, field=where or None)
    if isinstance(value, dict):
        for key, item in value.items():
            if SURROGATE.search(key):
                raise DataError(label, f"a field name, {ascii(key)}, is {_not_unicode(key)}", row=row,
                                field=where or None)
            _refuse_lone_surrogates(label, row, item, f"{where}.{key}" if where else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _refuse_lone_surrogates(label, row, item, f"{where}[{i}]")


def _not_unicode(text: str) -> str:
    found = SURROGATE.search(text)
    before = text[max(0, found.start() - 20):found.start()]
    return (f"not valid Unicode (a lone surrogate {ascii(found[0])[1:-1]} at character {found.start()}"
            f"{f', after {before!r}' if before else ''}: a \\u escape for half of a UTF-16 pair, without its other "
            "half)")


def _read_parquet(path: Path, label: str) -> list[Record]:
    pq = _require("pyarrow.parquet", "pyarrow", "Parquet files")
    try:
        rows = pq.read_table(path).to_pylist()
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise DataError(label, f"cannot read Parquet: {e}") from e
    return [Record(label, i, row) for i, row in enumerate(rows, start=1)]


def _read_saved_dataset(directory: Path, split: str | None, label: str) -> list[Record]:
    datasets = _require("datasets", "datasets", "saved dataset directories")
    try:
        ds = datasets.load_from_disk(str(directory))
    except (OSError, ValueError) as e:
        raise DataError(label, f"a directory must be saved with datasets' save_to_disk ({e}); "
                               f"supported: {SUPPORTED}") from e
    if isinstance(ds, datasets.DatasetDict):
        names = ", ".join(ds)
        if split is None:
            raise DataError(label, f"holds a DatasetDict with splits {names}; name one as "
                                   f"'{directory}::{next(iter(ds), 'train')}'")
        if split not in ds:
            raise DataError(label, f"no split '{split}'; the DatasetDict has {names}")
        ds = ds[split]
    elif split is not None:
        raise DataError(label, f"'::{split}' names a split, but the directory holds a single Dataset")
    return [Record(label, i, row) for i, row in enumerate(ds.to_list(), start=1)]


def _require(module: str, package: str, what: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"reading {what} needs the '{package}' package: pip install {package}") from e
