"""CSV and TSV files as records: a header row names the columns, every value is text as
written, quoted values may span lines, and a quote never closed is named by the line it opens on."""

from __future__ import annotations

import contextlib
import io
import itertools
from pathlib import Path

from lmpo.envs.data.records import DataError, Record, _not_utf8, _open, _read_bytes


def read_csv(path: Path, label: str, delimiter: str) -> list[Record]:
    """A spreadsheet export: the header row names the columns, every value is text as written (an
    answer `007` stays `007`), an empty cell is a missing value; row N is the Nth row after the
    header, and errors name the file line it starts on too (`line 3 (row 2)`); quoted values
    may span lines."""
    import csv

    records = []
    limit = csv.field_size_limit(2**31 - 1)  # the default 131,072 characters refused a long document
    with (_open(path, label) as (stream, _), io.TextIOWrapper(stream, encoding="utf-8-sig", newline="") as f,
          _restored_field_limit(limit)):
        # strict: otherwise a quote never closed silently takes every later line into one value
        reader = csv.DictReader(f, delimiter=delimiter, strict=True)
        last_line = 0
        try:
            for row, values in enumerate(reader, start=1):
                line = reader.line_num - _line_breaks(values)  # where the row starts: blank lines skipped are counted
                if None in values:  # more cells than the header names
                    raise DataError(label, f"{len(reader.fieldnames) + len(values[None])} values under a header of "
                                           f"{len(reader.fieldnames)} columns", row=row, line=line)
                records.append(Record(label, row, {k: (v if v != "" else None) for k, v in values.items()}, line=line))
                last_line = reader.line_num
        except UnicodeDecodeError as e:
            raise DataError(label, _not_utf8(e, _read_bytes(path, label, 2), path)) from None
        except csv.Error as e:
            if str(e) == "unexpected end of data":
                raise _unclosed_quote(path, label, delimiter, last_line + 1) from None
            if str(e).endswith("expected after '\"'"):
                raise DataError(label, f"line {reader.reader.line_num}: text after the closing quote of a quoted value "
                                       "(a value that starts with \" ends at the next lone \"; write a \" inside "
                                       "one as \"\")") from None
            raise DataError(label, f"not valid CSV ({e}, file line {reader.reader.line_num})") from None
    return records


def _line_breaks(values: dict) -> int:
    """Line breaks inside the row's quoted values: the lines it spans after its first."""
    cells = [v for k, v in values.items() if k is not None] + (values.get(None) or [])
    return sum(cell.count("\n") for cell in cells if isinstance(cell, str))


@contextlib.contextmanager
def _restored_field_limit(limit: int):
    import csv

    try:
        yield
    finally:
        csv.field_size_limit(limit)


def _unclosed_quote(path: Path, label: str, delimiter: str, first: int) -> DataError:
    """The error for a quoted value that runs to the end of the file, naming the line of its
    opening quote: the row that starts at line `first` is read again as the csv module does."""
    opened, quoted, closed, field_start, number = first, False, False, True, first - 1
    with _open(path, label) as (stream, _), io.TextIOWrapper(stream, encoding="utf-8-sig", newline="") as f:
        for number, line in enumerate(itertools.islice(f, first - 1, None), start=first):
            at = 0
            while at < len(line):
                if quoted:  # to its closing quote, or through the line
                    end = line.find('"', at)
                    quoted, closed, at = end < 0, end >= 0, len(line) if end < 0 else end + 1
                    continue
                char = line[at]
                if char == '"' and (closed or field_start):  # after a closing quote: a doubled "" inside the value
                    quoted, opened = True, opened if closed else number
                closed, field_start, at = False, char in (delimiter, "\r", "\n"), at + 1
    lines = f"lines {opened} to {number}" if number > opened else "its last line"
    return DataError(label, f"line {opened}: a quoted value opened here is never closed: it would take in the rest "
                            f"of the file ({lines}); end it with a \", and write a \" inside "
                            "a value as \"\"")
