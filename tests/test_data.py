import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lmpo.envs.data import DataError, TokenizedExample, load_preferences, load_prompts, load_sft, pack, read_records

SYSTEM, USER, ASSISTANT = "<|system|>", "<|user|>", "<|assistant|>"


def write(path, rows):
    """Rows to `path` as JSONL or Parquet by its suffix; `path` back."""
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def decode(tok, ids):
    return tok.decode(ids, skip_special_tokens=False)


def loss_text(tok, ex: TokenizedExample) -> str:
    """The characters that carry loss, in order."""
    return decode(tok, [t for t, m in zip(ex.input_ids, ex.loss_mask) if m])


def msg(role, content):
    return {"role": role, "content": content}


CHAT = [msg("system", "be brief"), msg("user", "2+2"), msg("assistant", "4"), msg("user", "and 3+3?"),
        msg("assistant", "six")]


@pytest.fixture(params=["jsonl", "parquet"])
def ext(request):
    return request.param


def test_messages_put_loss_on_assistant_turns_and_their_eos(char_tokenizer, tmp_path, ext):
    path = write(tmp_path / f"chat.{ext}", [{"messages": CHAT, "id": 7}])
    examples, report = load_sft(path, char_tokenizer, max_length=64)
    (ex,) = examples
    assert decode(char_tokenizer, ex.input_ids) == (f"{SYSTEM}be brief{USER}2+2{ASSISTANT}4<eos>"
                                                    f"{USER}and 3+3?{ASSISTANT}six<eos>")
    assert loss_text(char_tokenizer, ex) == "4<eos>six<eos>"
    # the mask sits on those exact positions, not just the right characters
    assert ex.loss_mask[-4:] == [1, 1, 1, 1] and ex.loss_mask[-5] == 0
    assert (report.shape, report.shape_field, report.rows, report.kept) == ("messages", "messages", 1, 1)
    assert "messages" in report.summary() and str(path) in report.summary()


def test_prompt_completion_strings_are_not_templated(char_tokenizer, tmp_path, ext):
    path = write(tmp_path / f"pc.{ext}", [{"prompt": "31=", "completion": "13"}, {"prompt": "9=", "completion": "9"}])
    examples, report = load_sft(path, char_tokenizer, max_length=16)
    assert decode(char_tokenizer, examples[0].input_ids) == "31=13<eos>"
    assert examples[0].loss_mask == [0, 0, 0, 1, 1, 1]
    assert [loss_text(char_tokenizer, ex) for ex in examples] == ["13<eos>", "9<eos>"]
    assert report.shape == "prompt/completion"


@pytest.mark.parametrize("completion", ["hey", msg("assistant", "hey"), [msg("assistant", "hey")],
                                        [msg("user", "hi"), msg("assistant", "hey")]])
def test_prompt_completion_messages_use_the_chat_template(char_tokenizer, tmp_path, completion):
    path = write(tmp_path / "pc.jsonl", [{"prompt": [msg("user", "hi")], "completion": completion}])
    (ex,), report = load_sft(path, char_tokenizer, max_length=16)
    assert decode(char_tokenizer, ex.input_ids) == f"{USER}hi{ASSISTANT}hey<eos>"
    assert loss_text(char_tokenizer, ex) == "hey<eos>" and report.shape == "prompt/completion (chat)"


def test_text_documents_carry_loss_everywhere_and_pack(char_tokenizer, tmp_path, ext):
    path = write(tmp_path / f"cpt.{ext}", [{"text": "abc"}, {"text": "de"}])
    examples, report = load_sft(path, char_tokenizer, max_length=8)
    assert [decode(char_tokenizer, ex.input_ids) for ex in examples] == ["abc<eos>", "de<eos>"]
    assert all(all(ex.loss_mask) for ex in examples) and report.shape == "text"
    rows = pack(examples, 3)
    assert [decode(char_tokenizer, r.input_ids) for r in rows] == ["abc", "<eos>de", "<eos>"]
    assert [len(r.loss_mask) for r in rows] == [3, 3, 1]


def test_saved_dataset_directory_and_its_splits(char_tokenizer, tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = {"prompt": ["1=", "2="], "completion": ["1", "2"]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "single"))
    examples, _ = load_sft(tmp_path / "single", char_tokenizer, max_length=8)
    assert [loss_text(char_tokenizer, ex) for ex in examples] == ["1<eos>", "2<eos>"]
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)}).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(DataError, match="splits train.*::train"):
        read_records(tmp_path / "dict")
    assert [r.row for r in read_records(f"{tmp_path / 'dict'}::train")] == [1, 2]
    with pytest.raises(DataError, match="no split 'test'"):
        read_records(f"{tmp_path / 'dict'}::test")


def test_preferences_from_strings_and_messages(char_tokenizer, tmp_path, ext):
    path = write(tmp_path / f"p.{ext}", [{"prompt": "3=", "chosen": "3", "rejected": "4"}])
    (pair,), report = load_preferences(path, char_tokenizer, max_length=8)
    assert [decode(char_tokenizer, ids) for ids in (pair.prompt_ids, pair.chosen_ids, pair.rejected_ids)] == [
        "3=", "3<eos>", "4<eos>"]
    assert report.shape == "prompt/chosen/rejected"
    chat_rows = [{"prompt": "q", "chosen": [msg("user", "q"), msg("assistant", "yes")],
                  "rejected": msg("assistant", "no")}]
    (pair,), report = load_preferences(write(tmp_path / f"c.{ext}", chat_rows), char_tokenizer, max_length=32)
    assert [decode(char_tokenizer, ids) for ids in (pair.prompt_ids, pair.chosen_ids, pair.rejected_ids)] == [
        f"{USER}q{ASSISTANT}", "yes<eos>", "no<eos>"]
    assert (report.shape, report.shape_field) == ("prompt/chosen/rejected (chat)", "chosen")


def test_prompts_keep_extra_columns_for_rewards(char_tokenizer, tmp_path, ext):
    rows = [{"prompt": "31=", "answer": "13", "reference": "thirteen", "level": 2},
            {"prompt": "7=", "answer": None, "reference": "seven", "level": 1}]
    problems = load_prompts(write(tmp_path / f"rl.{ext}", rows))
    assert [(p.prompt, p.answer) for p in problems] == [("31=", "13"), ("7=", "")]
    assert problems[0].meta == {"reference": "thirteen", "level": 2}
    chat_rows = [{"question": [msg("user", "hi")], "answer": 5}]
    (p,) = load_prompts(write(tmp_path / f"q.{ext}", chat_rows), prompt_field="question", tokenizer=char_tokenizer)
    assert (p.prompt, p.answer, p.meta) == (f"{USER}hi{ASSISTANT}", "5", {})
    with pytest.raises(DataError, match="tokenizer="):
        load_prompts(tmp_path / f"q.{ext}", prompt_field="question")


GOOD_PC = {"prompt": "1=", "completion": "1"}
GOOD_CHAT = {"messages": [msg("user", "a"), msg("assistant", "b")]}
BAD_ROWS = {  # name: (loader, second line of the JSONL file, field named in the error)
    "invalid json": ("sft", '{"prompt": "1=", ', None),
    "non-object line": ("sft", "[1, 2]", None),
    "missing field": ("sft", {"prompt": "2="}, "completion"),
    "wrong type": ("sft", {"messages": "hi"}, "messages"),
    "message not an object": ("sft", {"messages": ["hi"]}, "messages[0]"),
    "bad role": ("sft", {"messages": [msg("user", "a"), msg("bot", "b")]}, "messages[1].role"),
    "no assistant turn": ("sft", {"messages": [msg("user", "a")]}, "messages"),
    "empty completion": ("sft", {"prompt": "2=", "completion": ""}, "completion"),
    "mixed shapes": ("sft", {"text": "abc"}, "text"),
    "identical chosen/rejected": ("pref", {"prompt": "q", "chosen": "a", "rejected": "a"}, "rejected"),
    "missing rejected": ("pref", {"prompt": "q", "chosen": "a"}, "rejected"),
    "missing prompt": ("prompts", {"question": "q"}, "prompt"),
    "answer of wrong type": ("prompts", {"prompt": "q", "answer": [1]}, "answer"),
}


@pytest.mark.parametrize("name", BAD_ROWS)
def test_bad_rows_name_file_row_and_field(char_tokenizer, tmp_path, name):
    loader, bad, field = BAD_ROWS[name]
    chat = isinstance(bad, dict) and "messages" in bad
    first = {"sft": GOOD_CHAT if chat else GOOD_PC, "pref": {"prompt": "q", "chosen": "a",
             "rejected": "b"}, "prompts": {"prompt": "p"}}[loader]
    bad_line = bad if isinstance(bad, str) else json.dumps(bad)
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(first) + "\n\n" + bad_line + "\n")  # a blank line still counts as a row number
    load = {"sft": lambda: load_sft(path, char_tokenizer, max_length=32),
            "pref": lambda: load_preferences(path, char_tokenizer, max_length=32),
            "prompts": lambda: load_prompts(path)}[loader]
    with pytest.raises(DataError) as info:
        load()
    text = str(info.value)
    assert text.startswith(f"{path}: row 3: ") and info.value.row == 3, text
    if field is not None:
        assert f"field '{field}'" in text and info.value.field == field, text
    assert "expected" in text or "not valid JSON" in text, text


def test_a_row_cut_short_names_the_column_in_that_row(char_tokenizer, tmp_path):
    path = tmp_path / "cut.jsonl"
    path.write_text(json.dumps(GOOD_PC) + "\n" + '{"prompt": "a", "completion": \r\n')  # a CRLF file
    with pytest.raises(DataError, match=r"cut\.jsonl: row 2: not valid JSON \(Expecting value at column 31\)"):
        load_sft(path, char_tokenizer, max_length=32)


def test_bad_row_in_parquet_names_its_row(char_tokenizer, tmp_path):
    path = write(tmp_path / "t.parquet", [GOOD_PC, {"prompt": "2=", "completion": None}])
    with pytest.raises(DataError, match=r"t\.parquet: row 2: field 'completion': expected a non-empty string"):
        load_sft(path, char_tokenizer, max_length=32)


def test_wrong_type_error_reads_naturally(char_tokenizer, tmp_path):
    path = write(tmp_path / "data.jsonl", [{"messages": "hi"}])
    with pytest.raises(DataError) as info:
        load_sft(path, char_tokenizer, max_length=32)
    assert str(info.value) == (f"{path}: row 1: field 'messages': expected a list of {{role, content}} objects, "
                               "got str")


@pytest.mark.parametrize("chosen, got", [({"text": "a"}, "an object with keys 'text'"), ({}, "{}")])
def test_a_reply_object_that_is_no_message_says_what_a_message_is(chosen, got, char_tokenizer, tmp_path):
    """`{"text": ...}` as a reply was refused as "field 'chosen.role': expected one of 'system',
    ..., got None", which does not say the value should be a message (or a string)."""
    path = write(tmp_path / "p.jsonl", [{"prompt": "hi", "chosen": chosen, "rejected": "b"}])
    with pytest.raises(DataError) as info:
        load_preferences(path, char_tokenizer, max_length=32)
    assert str(info.value) == f"{path}: row 1: field 'chosen': expected a {{role, content}} message object, got {got}"


def test_unsupported_file_and_missing_file(tmp_path):
    (tmp_path / "x.xlsx").write_text("a,b\n")
    with pytest.raises(DataError, match=r"unsupported file type '\.xlsx'.*\.jsonl, \.json .*\.parquet, \.csv or \.tsv"):
        read_records(tmp_path / "x.xlsx")
    with pytest.raises(DataError, match="no such file"):
        read_records(tmp_path / "nope.jsonl")


def test_overlong_policies_and_report_counts(char_tokenizer, tmp_path):
    # lengths: 4+1 eos, 8+1 eos, and a prompt that alone fills max_length
    rows = [{"prompt": "ab", "completion": "cd"}, {"prompt": "abcd", "completion": "efgh"},
            {"prompt": "abcdefgh", "completion": "x"}]
    path = write(tmp_path / "long.jsonl", rows)
    with pytest.raises(DataError, match=r"long\.jsonl: row 2: fields 'prompt' \(4 characters\) \+ 'completion' "
                                        r"\(4 characters\): 9 tokens together, over max_length 6"):
        load_sft(path, char_tokenizer, max_length=6)
    kept, report = load_sft(path, char_tokenizer, max_length=6, overlong="skip")
    assert len(kept) == 1 and (report.rows, report.kept, report.skipped_overlong, report.truncated) == (3, 1, 2, 0)
    cut, report = load_sft(path, char_tokenizer, max_length=6, overlong="truncate")
    assert (report.kept, report.skipped_overlong, report.truncated) == (2, 1, 1)
    assert decode(char_tokenizer, cut[1].input_ids) == "abcdef" and loss_text(char_tokenizer, cut[1]) == "ef"
    assert "1 skipped, 1 truncated" in report.summary() and "truncate" in report.summary()
    with pytest.raises(DataError, match="no examples left"):
        load_sft(path, char_tokenizer, max_length=2, overlong="skip")


def test_overlong_preference_pairs_keep_the_prompt(char_tokenizer, tmp_path):
    rows = [{"prompt": "ab", "chosen": "cdex", "rejected": "cdey"},
            {"prompt": "ab", "chosen": "xyz", "rejected": "xyw"}]
    path = write(tmp_path / "p.jsonl", rows)
    with pytest.raises(DataError, match=r"row 1: fields 'prompt' \(2 characters\) \+ 'chosen' \(4 characters\): 7 tokens together, "
                                        "over max_length 5"):
        load_preferences(path, char_tokenizer, max_length=5)
    pairs, report = load_preferences(path, char_tokenizer, max_length=5, overlong="truncate")
    # row 1's replies become identical once cut to 3 tokens, so it is skipped
    assert (report.kept, report.skipped_overlong, report.truncated) == (1, 1, 1)
    assert [decode(char_tokenizer, ids) for ids in (pairs[0].chosen_ids, pairs[0].rejected_ids)] == ["xyz", "xyw"]


def test_sft_and_cpt_train_on_a_users_jsonl_file(tmp_path):
    """`lmpo train sft/cpt --data FILE` end to end on the embedded tiny preset."""
    from lmpo.cli.main import main

    sft = tmp_path / "chat.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"{i}+{i}="}, {"role": "assistant", "content": str(2 * i)}]}
            for i in range(40)]
    sft.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert main(["train", "sft", "--model", "tiny", "--data", str(sft), "--out", str(tmp_path / "sft"),
                 "--epochs", "1", "--batch_size", "8", "--threads", "1"]) == 0
    saved = json.loads((tmp_path / "sft" / "result.json").read_text())
    assert saved["accuracy"] is None and (tmp_path / "sft" / "model" / "model.safetensors").exists()
    text = tmp_path / "text.jsonl"
    text.write_text("\n".join(json.dumps({"text": "lorem ipsum dolor sit amet " * 3}) for _ in range(30)) + "\n")
    assert main(["train", "cpt", "--model", "tiny", "--data", str(text), "--out", str(tmp_path / "cpt"),
                 "--steps", "2", "--seq_len", "32", "--batch_size", "4", "--threads", "1"]) == 0


def test_sft_on_a_users_file_reports_held_out_accuracy_on_their_prompts(tmp_path, capsys):
    """With --eval_prompts, training on --data is graded on the user's own held-out prompts."""
    from lmpo.cli.main import main

    rows = [{"prompt": f"{i}=", "completion": str(i % 3)} for i in range(60)]
    data, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    held.write_text("\n".join(json.dumps({"prompt": f"{i}=", "answer": str(i % 3)}) for i in range(100, 110)) + "\n")
    assert main(["train", "sft", "--model", "tiny", "--data", str(data), "--eval_prompts", str(held),
                 "--task", "exact_match", "--out", str(tmp_path / "sft"), "--epochs", "1", "--batch_size", "8",
                 "--threads", "1"]) == 0
    saved = json.loads((tmp_path / "sft" / "result.json").read_text())
    assert saved["accuracy"] is not None and 0 <= saved["accuracy"] <= 1
    assert "held-out accuracy" in capsys.readouterr().out
    held.write_text('{"prompt": "1="}\n')  # no answer column: refused before any training step
    assert main(["train", "sft", "--model", "tiny", "--data", str(data), "--eval_prompts", str(held),
                 "--task", "exact_match", "--out", str(tmp_path / "sft2"), "--threads", "1"]) == 2
    assert "held.jsonl" in capsys.readouterr().err and not (tmp_path / "sft2" / "model").exists()


def test_a_bad_row_stops_training_with_its_location(tmp_path, capsys):
    from lmpo.cli.main import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n" + json.dumps({"prompt": "a", "completion": 3}) + "\n")
    assert main(["train", "sft", "--model", "tiny", "--data", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl" in err and "row 2" in err and "completion" in err


def _preference_rows(n):
    rows = []
    for i in range(n):
        if i % 2:  # strings
            rows.append({"prompt": f"{i}+{i}=", "chosen": str(2 * i), "rejected": str(2 * i + 1)})
        else:  # message lists
            rows.append({"prompt": [msg("user", f"{i}+{i}=")], "chosen": [msg("assistant", str(2 * i))],
                         "rejected": [msg("assistant", "no idea")]})
    return rows


@pytest.mark.parametrize("shape", ["strings", "messages"])
def test_dpo_and_reward_model_train_on_a_users_file(tmp_path, start_model, ext, shape):
    """`lmpo train dpo --data FILE` and `lmpo train rm --data FILE` (held-out split from the file)."""
    from lmpo.cli.main import main

    rows = [r for r in _preference_rows(48) if isinstance(r["prompt"], str) == (shape == "strings")]
    path = write(tmp_path / f"pairs.{ext}", rows)
    assert main(["train", "dpo", "--model", start_model, "--data", str(path), "--out", str(tmp_path / "dpo"),
                 "--batch_size", "8", "--threads", "1", "--save_every", "0"]) == 0
    dpo = [json.loads(line) for line in open(tmp_path / "dpo" / "metrics.jsonl")]
    assert dpo and "eval_accuracy" not in dpo[0]  # the task's held-out set says nothing about a user's data
    assert main(["train", "rm", "--model", start_model, "--data", str(path), "--heldout_pairs", "8",
                 "--out", str(tmp_path / "rm"), "--batch_size", "8", "--threads", "1", "--save_every", "0"]) == 0
    rm = json.loads((tmp_path / "rm" / "result.json").read_text())
    assert 0 <= rm["accuracy"] <= 1


def test_a_bad_preference_row_stops_training_with_its_location(tmp_path, start_model, capsys):
    from lmpo.cli.main import main

    path = write(tmp_path / "pairs.parquet", [{"prompt": "1=", "chosen": "1", "rejected": "2"},
                                              {"prompt": "2=", "chosen": "2", "rejected": "2"}])
    for command in ("dpo", "rm"):
        assert main(["train", command, "--model", start_model, "--data", str(path),
                     "--out", str(tmp_path / command)]) == 2
        err = capsys.readouterr().err
        assert "pairs.parquet: row 2: field 'rejected'" in err, err


def test_too_few_pairs_to_hold_out_is_a_clear_error(tmp_path, start_model, capsys):
    from lmpo.cli.main import main

    path = write(tmp_path / "pairs.jsonl", _preference_rows(4)[1::2])
    assert main(["train", "rm", "--model", start_model, "--data", str(path), "--out", str(tmp_path / "rm")]) == 2
    assert "too few to hold out 500" in capsys.readouterr().err


def test_encoding_through_the_fast_backend_gives_the_tokenizers_own_ids(char_tokenizer, tmp_path, capsys,
                                                                        monkeypatch):
    """Loading calls a fast tokenizer's backend directly (transformers' call cost ~10x the
    encoding), checked against the tokenizer's own call on the first texts; a tokenizer whose
    backend disagrees is encoded by its own call from then on. A long load says how far it is."""
    from transformers import AutoTokenizer

    import lmpo.envs.data.chat as chat
    import lmpo.envs.data.records as records
    from lmpo.envs.data import load_sft

    char_tokenizer.save_pretrained(tmp_path / "tok")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tok")
    texts = ["31415=11345", "Hello, world!\n", "<eos> inside", ""]
    assert [chat.encode(tokenizer, t) for t in texts] == [tokenizer(t, add_special_tokens=False).input_ids
                                                          for t in texts]
    assert tokenizer._lmpo_backend_encode == {"use": None, "checked": 4}

    class Disagreeing:  # a backend that drops the last token
        def encode(self, text, add_special_tokens):
            return type("Encoding", (), {"ids": tokenizer(text, add_special_tokens=False).input_ids[:-1]})()

    other = AutoTokenizer.from_pretrained(tmp_path / "tok")
    monkeypatch.setattr(type(other), "backend_tokenizer", property(lambda self: Disagreeing()))
    assert chat.encode(other, "12345") == other(text="12345", add_special_tokens=False).input_ids
    assert other._lmpo_backend_encode["use"] is False

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}=", "completion": f"{i}"}) + "\n" for i in range(3000)))
    monkeypatch.setattr(records.LoadProgress, "__init__", _every_call(records.LoadProgress.__init__))
    examples, _ = load_sft(data, tokenizer, max_length=64)
    assert len(examples) == 3000
    assert f"[data] {data}: tokenizing, 1,024 of 3,000 rows" in capsys.readouterr().err


def _every_call(init):
    def patched(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.every_s = 0.0
    return patched


def test_replies_alike_only_as_unknown_tokens_are_said_to_be(char_tokenizer, tmp_path):
    """" 你好" against " 世界" with a tokenizer that has neither: refused as "the same reply",
    though the texts differ; the cause is the tokenizer's unknown token."""
    same = write(tmp_path / "same.jsonl", [{"prompt": "q", "chosen": "ab", "rejected": "ab"}])
    with pytest.raises(DataError, match="expected a reply different from 'chosen', got the same reply$"):
        load_preferences(same, char_tokenizer, max_length=64)
    unknown = write(tmp_path / "unk.jsonl", [{"prompt": "q", "chosen": " 你好", "rejected": " 世界"}])
    with pytest.raises(DataError, match="got the same tokens: the texts differ, but the tokenizer cannot represent "
                                        "some of their characters"):
        load_preferences(unknown, char_tokenizer, max_length=64)
