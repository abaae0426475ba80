"""KTO's unpaired examples from users' files (`prompt`, `completion`, `label`): shapes, and bad
rows named by file, row and field."""

import pytest

from lmpo.envs.data import DataError
from lmpo.envs.data.unpaired import load_unpaired
from lmpo.trainers.pairs import unpair
from lmpo.envs.data.preferences import PreferencePair
from test_data import msg, write


@pytest.fixture(params=["jsonl", "parquet"])
def ext(request):
    return request.param


ROWS = [{"prompt": "1+1=", "completion": "2", "label": True}, {"prompt": "2+2=", "completion": "5", "label": False}]


def test_string_rows_are_tokenized_as_they_are_with_eos(char_tokenizer, tmp_path, ext):
    examples, report = load_unpaired(write(tmp_path / f"u.{ext}", ROWS), char_tokenizer, max_length=16)
    eos = char_tokenizer.eos_token_id
    assert [char_tokenizer.decode(e.prompt_ids) for e in examples] == ["1+1=", "2+2="]
    assert [e.completion_ids[-1] for e in examples] == [eos, eos]
    assert [char_tokenizer.decode(e.completion_ids[:-1]) for e in examples] == ["2", "5"]
    assert [e.desirable for e in examples] == [True, False]
    assert report.shape == "prompt/completion/label" and report.kept == 2


def test_chat_rows_use_the_chat_template(char_tokenizer, tmp_path):
    rows = [{"prompt": [msg("user", "1+1")], "completion": [msg("assistant", "2")], "label": True},
            {"prompt": "2+2", "completion": msg("assistant", "5"), "label": False}]
    examples, report = load_unpaired(write(tmp_path / "c.jsonl", rows), char_tokenizer, max_length=64)
    assert report.shape == "prompt/completion/label (chat)"
    for e, answer in zip(examples, "25"):
        assert char_tokenizer.decode(e.prompt_ids).endswith("<|assistant|>")
        assert char_tokenizer.decode(e.completion_ids).startswith(answer)
        assert e.completion_ids[-1] == char_tokenizer.eos_token_id


@pytest.mark.parametrize("row,message", [
    ({"prompt": "1=", "label": True}, r"row 2: field 'completion': expected a string or an assistant message, "
                                      r"got no such field \(the row has: prompt, label\)"),
    ({"prompt": "1=", "completion": "1"}, r"row 2: field 'label': expected true or false, got no such field"),
    ({"prompt": "1=", "completion": "1", "label": "yes"}, r"row 2: field 'label': expected true \(desirable\) or "
                                                          r"false \(undesirable\), or 1 or 0, got str"),
    ({"prompt": "1=", "completion": "1", "label": 2}, r"row 2: field 'label': expected true .*, or 1 or 0, got 2"),
    ({"prompt": 7, "completion": "1", "label": True}, r"row 2: field 'prompt': expected a string or a list of "
                                                      r"messages, got int"),
    ({"prompt": "1=", "completion": "", "label": True}, r"row 2: field 'completion': expected a non-empty string, "
                                                        r"got ''"),
    ({"prompt": "1=", "completion": 3.5, "label": False}, r"row 2: field 'completion': expected a string, an "
                                                          r"assistant message or a list of messages, got float"),
])
def test_bad_rows_name_file_row_and_field(char_tokenizer, tmp_path, row, message):
    path = write(tmp_path / "bad.jsonl", [ROWS[0], row, ROWS[1]])
    with pytest.raises(DataError, match=r"bad\.jsonl: " + message):
        load_unpaired(path, char_tokenizer, max_length=16)


@pytest.mark.parametrize("label,kind,missing", [(True, "desirable", "false"), (False, "undesirable", "true")])
def test_one_kind_only_is_refused_saying_what_is_missing(char_tokenizer, tmp_path, label, kind, missing):
    rows = [{"prompt": f"{i}=", "completion": str(i), "label": label} for i in range(3)]
    with pytest.raises(DataError, match=rf"one\.jsonl: all 3 examples are {kind}; KTO .* needs rows with label "
                                        rf"{missing}"):
        load_unpaired(write(tmp_path / "one.jsonl", rows), char_tokenizer, max_length=16)


def test_overlong_rows_error_skip_or_truncate_the_completion(char_tokenizer, tmp_path):
    rows = [*ROWS, {"prompt": "3+3=", "completion": "6666666", "label": True}]
    path = write(tmp_path / "long.jsonl", rows)
    with pytest.raises(DataError, match=r"long\.jsonl: row 3: fields 'prompt' \(4 characters\) \+ 'completion' "
                                        r"\(7 characters\): 12 tokens together, over max_length 8"):
        load_unpaired(path, char_tokenizer, max_length=8)
    kept, report = load_unpaired(path, char_tokenizer, max_length=8, overlong="skip")
    assert len(kept) == 2 and report.skipped_overlong == 1
    cut, report = load_unpaired(path, char_tokenizer, max_length=8, overlong="truncate")
    assert report.truncated == 1 and char_tokenizer.decode(cut[2].prompt_ids) == "3+3="  # the prompt is whole
    assert len(cut[2].prompt_ids) + len(cut[2].completion_ids) == 8


def test_pairs_unpair_into_a_desirable_and_an_undesirable_example():
    (good, bad) = unpair([PreferencePair([1, 2], [3, 0], [4, 0])])
    assert (good.prompt_ids, good.completion_ids, good.desirable) == ([1, 2], [3, 0], True)
    assert (bad.prompt_ids, bad.completion_ids, bad.desirable) == ([1, 2], [4, 0], False)


def test_csv_labels_are_text_and_read_as_true_or_false(char_tokenizer, tmp_path):
    """Every CSV value is text: `true` was refused as a string, so no CSV KTO file could be read."""
    path = tmp_path / "u.csv"
    path.write_text("prompt,completion,label\n1+1=,2,true\n2+2=,5,FALSE\n3+3=,6,1\n4+4=,9,0\n")
    examples, _ = load_unpaired(path, char_tokenizer, max_length=16)
    assert [e.desirable for e in examples] == [True, False, True, False]
    path.write_text("prompt,completion,label\n1+1=,2,yes\n2+2=,5,false\n")
    with pytest.raises(DataError, match=r"u.csv: line 2 \(row 1\): field 'label': expected true or false \(or 1 or 0\) for "
                                        r"desirable or undesirable, got 'yes'"):
        load_unpaired(path, char_tokenizer, max_length=16)
    write(tmp_path / "u.jsonl", [{**ROWS[0], "label": "true"}, ROWS[1]])  # JSON has booleans: a string stays refused
    with pytest.raises(DataError, match="field 'label': expected true \\(desirable\\) or false"):
        load_unpaired(tmp_path / "u.jsonl", char_tokenizer, max_length=16)


def test_a_zero_or_one_label_reads_alike_in_json_and_csv(char_tokenizer, tmp_path):
    """A CSV file's "1"/"0" was read as desirable/undesirable and a JSON file's 1/0 refused."""
    path = write(tmp_path / "u.jsonl", [{**ROWS[0], "label": 1}, {**ROWS[1], "label": 0}])
    kept, _ = load_unpaired(path, char_tokenizer, max_length=64)
    assert [e.desirable for e in kept] == [True, False]
