"""Reading each kind of data file: UTF-16 named as such, CSV/TSV exports, compressed files."""

import json

import pytest

from lmpo.envs.data import DataError, load_preferences, load_prompts, load_sft, read_records

from test_data import msg, write


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_utf16_file_is_named_as_such(tmp_path, suffix):
    """Windows tools save "Unicode" text as UTF-16; the error said only "invalid start byte"."""
    from lmpo.envs.data import load_prompts

    path = tmp_path / f"prompts{suffix}"
    path.write_text('{"prompt": "12=", "answer": "12"}\n', encoding="utf-16")
    with pytest.raises(ValueError, match=r"row 1: not valid UTF-8 \(invalid start byte at byte 0\); the file is UTF-16"):
        load_prompts(path)
    path.write_bytes('{"prompt": "café=", "answer": "1"}\n'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"not valid UTF-8 \(invalid continuation byte at byte 15\)$"):
        load_prompts(path)


def test_csv_and_tsv_files_are_read_with_every_value_as_text(char_tokenizer, tmp_path):
    """A spreadsheet export was refused ("unsupported file type '.csv'")."""
    path = tmp_path / "p.csv"
    path.write_text('prompt,answer,note\n12=,12,\n"3,1=",007,x\n"two\nlines=",13,y\n', encoding="utf-8-sig")
    problems = load_prompts(path, require_answer=True)
    assert [(p.prompt, p.answer) for p in problems] == [("12=", "12"), ("3,1=", "007"), ("two\nlines=", "13")]
    assert problems[0].meta == {"note": None} and problems[1].meta == {"note": "x"}  # an empty cell is missing
    tsv = tmp_path / "p.tsv"
    tsv.write_text("prompt\tchosen\trejected\n2+2=\t4\t5\n")
    (pair,), _ = load_preferences(tsv, char_tokenizer, max_length=64)
    assert char_tokenizer.decode(pair.chosen_ids) == "4<eos>"
    sft = tmp_path / "s.csv"
    sft.write_text("prompt,completion\n2+2=,4\n")
    assert load_sft(sft, char_tokenizer, max_length=64)[1].shape == "prompt/completion"
    bad = tmp_path / "bad.csv"
    bad.write_text("prompt,answer\n12=,12\n21=,12,extra\n")
    with pytest.raises(DataError, match=r"bad\.csv: line 3 \(row 2\): 3 values under a header of 2 columns$"):
        read_records(bad)
    no_answer = tmp_path / "na.csv"
    no_answer.write_text("prompt,answer\n12=,\n")
    with pytest.raises(DataError, match=r"na\.csv: line 2 \(row 1\): field 'answer'"):
        load_prompts(no_answer, require_answer=True)


def test_a_csv_rows_error_names_its_file_line_as_well(char_tokenizer, tmp_path):
    """"row 2" counted data rows while an unclosed quote said "line 2", and JSONL's "row N" is the
    file's line: a bad value on line 3 of a CSV file read as "row 2"."""
    path = tmp_path / "s.csv"
    path.write_text('prompt,completion\n1+1=,2\n\n"two\nlines=",3\n2+2=,\n')  # a blank line, a value on two
    with pytest.raises(DataError, match=r"s\.csv: line 6 \(row 3\): field 'completion': expected a non-empty string"):
        load_sft(path, char_tokenizer, max_length=64)
    tsv = tmp_path / "s.tsv"
    tsv.write_text("text\tprompt\na\t\n\tb=\n")
    with pytest.raises(DataError, match=r"s\.tsv: line 3 \(row 2\): field 'prompt': expected every row in the shape "
                                        r"'text' of line 2 \(row 1\) "):
        load_sft(tsv, char_tokenizer, max_length=64)


@pytest.mark.parametrize("module,suffix", [("gzip", ".gz"), ("bz2", ".bz2"), ("lzma", ".xz")])
def test_compressed_files_read_as_their_contents(module, suffix, char_tokenizer, tmp_path):
    """A `train.jsonl.gz` was refused ("unsupported file type '.gz'"); each kind of file reads
    the same rows compressed, errors keep their row numbers, and a corrupt file says so."""
    import importlib

    compress = importlib.import_module(module).compress
    rows = [{"prompt": "12=", "answer": "12"}, {"prompt": "31=", "answer": "13"}]
    jsonl = tmp_path / f"p.jsonl{suffix}"
    jsonl.write_bytes(compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    array = tmp_path / f"p.json{suffix}"
    array.write_bytes(compress(json.dumps(rows).encode()))
    csv = tmp_path / f"p.csv{suffix}"
    csv.write_bytes(compress(b"prompt,answer\n12=,12\n31=,13\n"))
    for path in (jsonl, array, csv):
        assert [(p.prompt, p.answer) for p in load_prompts(path)] == [("12=", "12"), ("31=", "13")], path
    pairs = tmp_path / f"pairs.tsv{suffix}"
    pairs.write_bytes(compress(b"prompt\tchosen\trejected\n2+2=\t4\t5\n"))
    assert len(load_preferences(pairs, char_tokenizer, max_length=64)[0]) == 1
    bad_row = tmp_path / f"bad.jsonl{suffix}"
    bad_row.write_bytes(compress(b'{"prompt": "1="}\n{"prompt": \n'))
    with pytest.raises(DataError, match=r"row 2: not valid JSON"):
        read_records(bad_row)
    corrupt = tmp_path / f"corrupt.jsonl{suffix}"
    corrupt.write_bytes(b"this is not compressed data at all")
    with pytest.raises(DataError, match=rf"corrupt.jsonl{suffix}: cannot decompress the {suffix} file"):
        read_records(corrupt)
    inner = tmp_path / f"notes.txt{suffix}"
    inner.write_bytes(compress(b"x"))
    with pytest.raises(DataError, match=rf"unsupported file type '.txt' inside the {suffix} file"):
        read_records(inner)


def test_a_gzip_file_named_without_gz_is_named_as_such(tmp_path):
    """It read `not valid UTF-8 (invalid start byte at byte 1)` and no more."""
    import gzip

    from lmpo.envs.data import DataError, read_records

    path = tmp_path / "corpus.jsonl"
    path.write_bytes(gzip.compress(b'{"text": "a b"}\n'))
    with pytest.raises(DataError, match=r"corpus\.jsonl: row 1: not valid UTF-8 .*; the file is gzip-compressed "
                                        r"\(it starts with gzip's bytes 1f 8b\) .*name it 'corpus\.jsonl\.gz'"):
        read_records(path)
    path.rename(tmp_path / "corpus.jsonl.gz")
    assert read_records(tmp_path / "corpus.jsonl.gz")[0].get("text") == "a b"


def test_a_csv_quote_never_closed_names_the_line_it_opens(char_tokenizer, tmp_path):
    """An unterminated quote took every later line into one value, silently: 4 rows read as 2
    prompts, and `--kind sft` blamed a missing 'completion'. Values quoted over lines still read."""
    path = tmp_path / "u.csv"
    path.write_text('prompt,answer\n1=,1\n"3=,3\n4=,4\n5=,5\n')
    never_closed = r"u\.csv: line 3: a quoted value opened here is never closed: it would take in the rest of the file"
    with pytest.raises(DataError, match=never_closed + r" \(lines 3 to 5\); end it with a \""):
        load_prompts(path)
    with pytest.raises(DataError, match=never_closed):
        load_sft(path, char_tokenizer, max_length=64)
    path.write_text('prompt,answer\n"two\nlines=","say ""hi""\n"\n\n3=,"3\n4=,4')  # opened in the second column
    with pytest.raises(DataError, match=r"u\.csv: line 6: .* never closed: .* \(lines 6 to 7\)"):
        read_records(path)
    path.write_text('prompt,answer\n"two\nlines=","say ""hi""\n"\n')
    assert [r.fields for r in read_records(path)] == [{"prompt": "two\nlines=", "answer": 'say "hi"\n'}]
    tsv = tmp_path / "u.tsv"
    tsv.write_text('prompt\tanswer\r\n1=\t1\r\n2=\t"2\r\n')
    with pytest.raises(DataError, match=r"u\.tsv: line 3: .* never closed: .* \(its last line\)"):
        read_records(tsv)
    path.write_text('prompt,answer\n1=,1\n"3=" ,3\n')
    with pytest.raises(DataError, match=r"u\.csv: line 3: text after the closing quote of a quoted value"):
        read_records(path)


def test_a_csv_value_longer_than_the_csv_modules_limit_is_read(tmp_path):
    """A document of 200,000 characters in one cell was refused with the csv module's "field
    larger than field limit (131072)"; an unclosed quote before that much text was named so too."""
    import csv

    limit = csv.field_size_limit()
    path = tmp_path / "long.csv"
    document = "word " * 40_000
    path.write_text(f'text\n"{document}"\nshort\n')
    assert [r.get("text") for r in read_records(path)] == [document, "short"]
    path.write_text(f'text\nshort\n"{document}\nmore\n')
    with pytest.raises(DataError, match=r"long\.csv: line 3: a quoted value opened here is never closed"):
        read_records(path)
    assert csv.field_size_limit() == limit  # the process's own limit is left as it was


@pytest.mark.parametrize("row, field, at", [
    ({"prompt": "12=\ud800", "answer": "12"}, "prompt", r"\\ud800 at character 3, after '12='"),
    ({"prompt": "12=", "completion": "x\udfff"}, "completion", r"\\udfff at character 1, after 'x'"),
    ({"prompt": "1", "chosen": "a", "rejected": "\udc80b"}, "rejected", r"\\udc80 at character 0:"),
    ({"text": "ok", "meta": {"tags": ["a", "b\ud800"]}}, r"meta\.tags\[1\]", r"\\ud800 at character 1"),
    ({"messages": [{"role": "user", "content": "hi\udc80"}]}, r"messages\[0\]\.content", r"\\udc80 at character 2"),
])
@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_lone_surrogate_in_a_json_row_names_its_field(tmp_path, row, field, at, suffix):
    """JSON's `\\ud800` escape decodes to half a UTF-16 pair, which no tokenizer encodes: `lmpo
    data` and the trainers stopped with a tokenizers TypeError traceback."""
    path = tmp_path / f"s{suffix}"
    text = json.dumps(row) if suffix == ".jsonl" else json.dumps([{"prompt": "1=", "answer": "1"}, row])
    path.write_text(text + "\n")
    with pytest.raises(DataError, match=rf"s{suffix}: row {1 if suffix == '.jsonl' else 2}: field '{field}': "
                                        rf"not valid Unicode \(a lone surrogate {at}"):
        read_records(path)


def test_paired_surrogate_escapes_and_escaped_backslashes_are_text(char_tokenizer, tmp_path):
    path = tmp_path / "ok.jsonl"
    path.write_text('{"prompt": "\\ud83d\\ude00=", "completion": "\\\\ud800"}\n')
    (example,), _ = load_sft(path, char_tokenizer, max_length=64)
    assert read_records(path)[0].fields == {"prompt": "\U0001F600=", "completion": "\\ud800"}


def test_a_null_or_missing_field_is_named_as_such(char_tokenizer, tmp_path):
    """`{"text": null}` read "got fields none", a message without content "got null", and a .json
    file holding its rows under a key gave no hint that the list itself is what to give."""
    path = write(tmp_path / "t.jsonl", [{"text": "abc"}, {"text": None}])
    with pytest.raises(DataError, match=r"t\.jsonl: row 2: field 'text': expected a non-empty string, got null \(the "
                                        r"row's other fields: none\)$"):
        load_sft(path, char_tokenizer, max_length=32)
    path = write(tmp_path / "m.jsonl", [{"messages": [{"role": "user"}, msg("assistant", "3")]}])
    with pytest.raises(DataError, match=r"row 1: field 'messages\[0\].content': expected a string, got no content "
                                        r"field \(the message has: role\)$"):
        load_sft(path, char_tokenizer, max_length=32)
    path = write(tmp_path / "r.jsonl", [{"messages": [{"content": "q"}, msg("assistant", "3")]}])
    with pytest.raises(DataError, match=r"field 'messages\[0\].role': expected one of .*, got no role field"):
        load_sft(path, char_tokenizer, max_length=32)
    path = tmp_path / "o.json"
    path.write_text(json.dumps({"data": [{"prompt": "1+1=", "completion": "2"}] * 3}))
    with pytest.raises(DataError, match=r"o\.json: row 1: .*got fields data; if the file is one object holding its "
                                        r"rows under 'data' \(a list of 3 objects\), give that list itself as the "
                                        r"file \(a JSON array, or one object per line\)$"):
        load_sft(path, char_tokenizer, max_length=32)


def test_a_symlink_loop_or_a_broken_symlink_is_named_as_such(tmp_path):
    """`ls` lists both, and both were 'no such file or directory'."""
    (tmp_path / "loop1.jsonl").symlink_to("loop2.jsonl")
    (tmp_path / "loop2.jsonl").symlink_to("loop1.jsonl")
    (tmp_path / "broken.jsonl").symlink_to("gone.jsonl")
    with pytest.raises(DataError, match="loop1.jsonl: a symlink loop \\(too many levels of symbolic links\\)"):
        read_records(tmp_path / "loop1.jsonl")
    with pytest.raises(DataError, match="broken.jsonl: a broken symlink \\(to gone.jsonl, which does not exist\\)"):
        read_records(tmp_path / "broken.jsonl")
    with pytest.raises(DataError, match="absent.jsonl: no such file or directory"):
        read_records(tmp_path / "absent.jsonl")
