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


def test_unsupported_file_and_missing_file(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match=r"unsupported file type '\.csv'.*\.jsonl, \.parquet"):
        read_records(tmp_path / "x.csv")
    with pytest.raises(DataError, match="no such file"):
        read_records(tmp_path / "nope.jsonl")


def test_overlong_policies_and_report_counts(char_tokenizer, tmp_path):
    # lengths: 4+1 eos, 8+1 eos, and a prompt that alone fills max_length
    rows = [{"prompt": "ab", "completion": "cd"}, {"prompt": "abcd", "completion": "efgh"},
            {"prompt": "abcdefgh", "completion": "x"}]
    path = write(tmp_path / "long.jsonl", rows)
    with pytest.raises(DataError, match=r"long\.jsonl: row 2: field 'prompt': 9 tokens, over max_length 6"):
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
    with pytest.raises(DataError, match="row 1: field 'prompt': 7 tokens, over max_length 5"):
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


GEMMA_LIKE = ("{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
              "{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n"
              "{% endif %}")


def gemma_like_tokenizer(tmp_path, generation_eos: bool):
    """A directory whose chat template ends a turn with `<end_of_turn>`, a token only its
    generation config names as a stop (as Gemma's does); the tokenizer's eos stays `<eos>`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lmpo.models import build_char_tokenizer
    from lmpo.models.loading import load_tokenizer

    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
    tok.chat_template = GEMMA_LIKE
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
    end = tok.convert_tokens_to_ids("<end_of_turn>")
    model.generation_config.eos_token_id = [tok.eos_token_id, end] if generation_eos else tok.eos_token_id
    model.save_pretrained(tmp_path / "gemma_like")
    tok.save_pretrained(tmp_path / "gemma_like")
    return load_tokenizer(str(tmp_path / "gemma_like")), model


def test_a_turn_may_end_with_the_end_of_turn_token_sampling_stops_on(tmp_path):
    from lmpo.rollout.engines import stop_token_ids

    tok, model = gemma_like_tokenizer(tmp_path, generation_eos=True)
    (ex,), _ = load_sft(write(tmp_path / "c.jsonl", [{"messages": CHAT[1:3]}]), tok, max_length=128)
    assert loss_text(tok, ex) == "4<end_of_turn>"  # the newline after it carries no loss
    (pair,), _ = load_preferences(write(tmp_path / "p.jsonl", [{"prompt": "q", "chosen": [msg("assistant", "y")],
                                                               "rejected": [msg("assistant", "n")]}]),
                                  tok, max_length=128)
    assert decode(tok, pair.chosen_ids) == "y<end_of_turn>"
    from lmpo.envs.data.chat import turn_end_ids
    assert turn_end_ids(tok) == stop_token_ids(model, tok)  # what the data ends turns with, sampling stops on


def test_a_turn_ending_with_no_token_sampling_stops_on_is_refused(tmp_path):
    tok, _ = gemma_like_tokenizer(tmp_path, generation_eos=False)
    with pytest.raises(DataError, match=r"row 1: field 'messages\[1\]'.*without a token sampling stops on \('<eos>'"):
        load_sft(write(tmp_path / "c.jsonl", [{"messages": CHAT[1:3]}]), tok, max_length=128)


def test_a_lora_adapters_turns_end_where_its_base_models_sampling_stops(tmp_path):
    from lmpo.envs.data.chat import turn_end_ids
    from lmpo.models.loading import load_tokenizer

    tok, _ = gemma_like_tokenizer(tmp_path, generation_eos=True)
    adapter = tmp_path / "adapter"  # as lmpo and PEFT save one: the tokenizer beside it, no generation config
    tok.save_pretrained(adapter)
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tmp_path / "gemma_like")}))
    assert turn_end_ids(load_tokenizer(str(adapter))) == turn_end_ids(tok) == [tok.eos_token_id,
                                                                              tok.convert_tokens_to_ids("<end_of_turn>")]


HERMES_LIKE = (
    "{%- if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>\n"
    "{%- endif %}{%- for m in messages %}{%- if m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{%- endif %}{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")
LOOKUP = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}


def tool_conversation(arguments):
    return [msg("user", "id 4821?"),
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": "7"},
            msg("assistant", "It is 7.")]


@pytest.fixture
def hermes_tokenizer():
    from lmpo.models import build_char_tokenizer

    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token, tok.chat_template = "<|im_end|>", HERMES_LIKE
    return tok


@pytest.mark.parametrize("arguments", ['{"id": 4821}', {"id": 4821}])
def test_tool_calls_in_openai_shape_are_trained_as_the_template_writes_them(hermes_tokenizer, tmp_path, ext,
                                                                             arguments):
    from lmpo.envs.parsing import HermesFormat

    rows = [{"messages": tool_conversation(arguments), "tools": [LOOKUP]}, {"messages": CHAT[1:3], "tools": None}]
    (ex, plain), _ = load_sft(write(tmp_path / f"t.{ext}", rows), hermes_tokenizer, max_length=512)
    call_turn = '<tool_call>\n{"name": "lookup", "arguments": {"id": 4821}}\n</tool_call><|im_end|>'
    assert loss_text(hermes_tokenizer, ex) == call_turn + "It is 7.<|im_end|>"  # not the tool's response
    assert '<tools>{"type": "function"' in decode(hermes_tokenizer, ex.input_ids)
    parsed = HermesFormat().parse(call_turn.removesuffix("<|im_end|>"))  # what RL's parser reads back
    assert [(c.name, c.arguments) for c in parsed.calls] == [("lookup", {"id": 4821})]
    assert loss_text(hermes_tokenizer, plain) == "4<|im_end|>"


def test_a_template_that_ignores_tool_calls_is_refused(char_tokenizer, tmp_path):
    with pytest.raises(DataError, match=r"row 1: field 'messages': the tokenizer's chat template does not render "
                                        r"tool_calls"):
        load_sft(write(tmp_path / "t.jsonl", [{"messages": tool_conversation({"id": 4821})}]), char_tokenizer,
                 max_length=512)


@pytest.mark.parametrize("bad, where, expected", [
    ("{id: 4821", r"messages\[1\]\.tool_calls\[0\]\.function\.arguments", "a JSON object"),
    ([1], r"messages\[1\]\.tool_calls\[0\]\.function\.arguments", "a JSON object"),
])
def test_malformed_tool_calls_name_the_field(hermes_tokenizer, tmp_path, bad, where, expected):
    with pytest.raises(DataError, match=rf"row 1: field '{where}': expected {expected}"):
        load_sft(write(tmp_path / "t.jsonl", [{"messages": tool_conversation(bad)}]), hermes_tokenizer,
                 max_length=512)


def test_reasoning_content_is_trained_where_the_template_writes_it_and_refused_where_not(hermes_tokenizer,
                                                                                        char_tokenizer, tmp_path):
    turn = {"role": "assistant", "content": "4", "reasoning_content": "2 and 2"}
    path = write(tmp_path / "r.jsonl", [{"messages": [msg("user", "2+2"), turn]}])
    (ex,), _ = load_sft(path, hermes_tokenizer, max_length=512)
    assert loss_text(hermes_tokenizer, ex) == "<think>2 and 2</think>4<|im_end|>"
    with pytest.raises(DataError, match="does not render reasoning_content, so the model would learn these turns "
                                        "without their reasoning"):
        load_sft(path, char_tokenizer, max_length=512)


@pytest.mark.parametrize("flag", [{"weight": 0}, {"train": False}])
def test_a_per_turn_loss_flag_is_refused_not_ignored(char_tokenizer, tmp_path, flag):
    rows = [{"messages": [msg("user", "2+2"), {**msg("assistant", "5"), **flag}, msg("user", "again"),
                          msg("assistant", "4")]}]
    key = next(iter(flag))
    with pytest.raises(DataError, match=rf"row 1: field 'messages\[1\]\.{key}': expected no per-turn loss flag"):
        load_sft(write(tmp_path / "w.jsonl", rows), char_tokenizer, max_length=512)


QWEN3_LIKE = (  # as Qwen3's: only the turns after the last user turn show their thinking
    "{%- set ns = namespace(last_query=-1) %}{%- for m in messages %}{%- if m.role == 'user' %}"
    "{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}{{ '<|im_start|>assistant\\n' }}{%- if loop.index0 > ns.last_query %}"
    "{{ '<think>\\n' + (m.reasoning_content or '') + '\\n</think>\\n\\n' }}{%- endif %}{{ m.content + '<|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")


def test_a_template_that_renders_earlier_turns_otherwise_still_trains_each_turn_as_written(hermes_tokenizer,
                                                                                          tmp_path):
    """Qwen3's template drops an assistant turn's thinking once a later user turn follows, so the
    conversation through a turn renders it otherwise than the whole conversation does; each turn
    is then found in the whole conversation, through its first end-of-turn token."""
    hermes_tokenizer.chat_template = QWEN3_LIKE
    rows = [{"messages": [msg("user", "2+2"), {**msg("assistant", "4"), "reasoning_content": "two twos"},
                          msg("user", "and 3+3?"), {**msg("assistant", "six"), "reasoning_content": "three twice"}]}]
    (ex,), _ = load_sft(write(tmp_path / "q.jsonl", rows), hermes_tokenizer, max_length=512)
    assert decode(hermes_tokenizer, ex.input_ids).count("<think>") == 1  # the whole conversation, as Qwen3 renders it
    assert loss_text(hermes_tokenizer, ex) == "4<|im_end|><think>\nthree twice\n</think>\n\nsix<|im_end|>"


def test_without_a_generation_config_the_models_config_names_the_stops_as_transformers_derives_them(tmp_path):
    from transformers import AutoModelForCausalLM

    from lmpo.envs.data.chat import turn_end_ids
    from lmpo.rollout.engines import stop_token_ids

    tok, model = gemma_like_tokenizer(tmp_path, generation_eos=True)
    folder = tmp_path / "gemma_like"
    config = json.loads((folder / "config.json").read_text())
    config["eos_token_id"] = json.loads((folder / "generation_config.json").read_text())["eos_token_id"]
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "generation_config.json").unlink()
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    assert turn_end_ids(tok) == stop_token_ids(loaded, tok) == [tok.eos_token_id,
                                                                tok.convert_tokens_to_ids("<end_of_turn>")]


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_base_model_without_a_template_trains_on_chat_data_with_one_given_and_keeps_it(tiny_llama, char_tokenizer,
                                                                                     tmp_path, capsys):
    from lmpo.cli.main import main
    from lmpo.models.loading import load_tokenizer

    base = tmp_path / "base"  # as a base model ships: no chat template
    tiny_llama.save_pretrained(base)
    char_tokenizer.save_pretrained(base)
    (base / "chat_template.jinja").unlink()
    config = json.loads((base / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    data = write(tmp_path / "chat.jsonl", [{"messages": CHAT}] * 4)
    with pytest.raises(DataError, match="a tokenizer with a chat template"):
        load_sft(data, load_tokenizer(str(base)), max_length=128)
    template = tmp_path / "chatml.jinja"
    # ChatML with markers the embedded tokenizer spells in few tokens (its context is 128), its eos ending a turn
    template.write_text(CHATML.replace("<|im_start|>", "<|").replace("<|im_end|>", "<eos>"))
    args = ["train", "sft", "--model", str(base), "--data", str(data), "--out", str(tmp_path / "sft"),
            "--chat_template", str(template), "--epochs", "1", "--eval_problems", "0", "--threads", "1"]
    assert main(args) in (0, None)
    saved = load_tokenizer(str(tmp_path / "sft" / "model"))
    assert saved.chat_template == template.read_text()  # the next stage renders as this one trained
    (example,), _ = load_sft(write(tmp_path / "one.jsonl", [{"messages": CHAT}]), saved, max_length=128)
    assert loss_text(saved, example) == "4<eos>six<eos>"


def test_a_chat_template_that_cannot_render_is_refused_before_anything_loads(tmp_path):
    from lmpo.models.loading import load_tokenizer

    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m['content'] }\n")
    with pytest.raises(ValueError, match=r"--chat_template .*broken.jinja: the template cannot render"):
        load_tokenizer("tiny", chat_template=str(broken))
    with pytest.raises(ValueError, match=r"--chat_template .*missing.jinja: cannot read it"):
        load_tokenizer("tiny", chat_template=str(tmp_path / "missing.jinja"))
