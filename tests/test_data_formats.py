"""Other tools' dataset layouts: ShareGPT's `conversations` (from/value turns, LLaMA-Factory's
tool turns among them) and Alpaca's instruction/input/output rows, rendered with the chat
template; errors name the field as the file writes it."""

from __future__ import annotations

import json

import pytest

from lmpo.envs.data import DataError, load_preferences, load_sft
from lmpo.envs.data.prompts import load_prompts
from lmpo.envs.data.unpaired import load_unpaired

from test_chat_data import LOOKUP, hermes_tokenizer  # noqa: F401 (a fixture)
from test_data import decode, ext, loss_text, write  # noqa: F401 (ext: a fixture)


def turn(speaker, value):
    return {"from": speaker, "value": value}


def test_sharegpt_conversations_train_like_messages(char_tokenizer, tmp_path, ext):
    rows = [{"conversations": [turn("human", "2+2="), turn("gpt", "4"), turn("human", "and 3+3?"), turn("gpt", "6")],
             "system": "be brief"}] * 2
    (example, _), report = load_sft(write(tmp_path / f"s.{ext}", rows), char_tokenizer, max_length=256)
    assert "shape 'conversations (ShareGPT)'" in report.summary()
    assert decode(char_tokenizer, example.input_ids) == (
        "<|system|>be brief<|user|>2+2=<|assistant|>4<eos><|user|>and 3+3?<|assistant|>6<eos>")
    assert loss_text(char_tokenizer, example) == "4<eos>6<eos>"


def test_llama_factory_tool_turns_are_calls_and_tool_output(hermes_tokenizer, tmp_path):
    call = json.dumps({"name": "lookup", "arguments": {"id": 4821}})
    rows = [{"conversations": [turn("human", "id 4821?"), turn("function_call", call), turn("observation", "7"),
                               turn("gpt", "It is 7.")], "tools": json.dumps([LOOKUP])}]
    (example,), _ = load_sft(write(tmp_path / "s.jsonl", rows), hermes_tokenizer, max_length=512)
    assert loss_text(hermes_tokenizer, example) == (
        '<tool_call>\n{"name": "lookup", "arguments": {"id": 4821}}\n</tool_call><|im_end|>It is 7.<|im_end|>')
    assert "<tools>" in decode(hermes_tokenizer, example.input_ids)


def test_alpaca_rows_are_a_user_turn_and_the_reply(char_tokenizer, tmp_path, ext):
    rows = [{"instruction": "Add the numbers.", "input": "2+2", "output": "4", "system": "be brief",
             "history": [["hi", "hello"]]},
            {"instruction": "Say yes.", "input": "", "output": "yes", "system": "be brief", "history": []}]
    (first, second), report = load_sft(write(tmp_path / f"a.{ext}", rows), char_tokenizer, max_length=256)
    assert "shape 'instruction/output (Alpaca)'" in report.summary()
    assert decode(char_tokenizer, first.input_ids) == (
        "<|system|>be brief<|user|>hi<|assistant|>hello<eos><|user|>Add the numbers.\n2+2<|assistant|>4<eos>")
    assert loss_text(char_tokenizer, first) == "hello<eos>4<eos>"
    assert decode(char_tokenizer, second.input_ids) == "<|system|>be brief<|user|>Say yes.<|assistant|>yes<eos>"


@pytest.mark.parametrize("layout", ["sharegpt", "alpaca"])
def test_preference_pairs_in_llama_factorys_layouts(char_tokenizer, tmp_path, ext, layout):
    if layout == "sharegpt":
        row = {"conversations": [turn("human", "2+2=")], "system": "be brief",
               "chosen": turn("gpt", "4"), "rejected": turn("gpt", "5")}
    else:
        row = {"instruction": "Add.", "input": "2+2=", "system": "be brief", "chosen": "4", "rejected": "5"}
    (pair,), report = load_preferences(write(tmp_path / f"p.{ext}", [row]), char_tokenizer, max_length=256)
    assert f"({'ShareGPT' if layout == 'sharegpt' else 'Alpaca'})" in report.summary()
    user = "2+2=" if layout == "sharegpt" else "Add.\n2+2="
    assert decode(char_tokenizer, pair.prompt_ids) == f"<|system|>be brief<|user|>{user}<|assistant|>"
    assert decode(char_tokenizer, pair.chosen_ids) == "4<eos>" and decode(char_tokenizer, pair.rejected_ids) == "5<eos>"


@pytest.mark.parametrize("layout", ["sharegpt", "alpaca"])
def test_kto_examples_in_llama_factorys_layouts(char_tokenizer, tmp_path, ext, layout):
    def row(reply, tag):
        if layout == "sharegpt":
            return {"conversations": [turn("human", "2+2="), turn("gpt", reply)], "kto_tag": tag}
        return {"instruction": "2+2=", "output": reply, "kto_tag": tag}
    examples, report = load_unpaired(write(tmp_path / f"k.{ext}", [row("4", True), row("5", False)]), char_tokenizer,
                                     max_length=256)
    assert "kto_tag" in report.summary()
    assert [(decode(char_tokenizer, e.prompt_ids), decode(char_tokenizer, e.completion_ids), e.desirable)
            for e in examples] == [("<|user|>2+2=<|assistant|>", "4<eos>", True),
                                   ("<|user|>2+2=<|assistant|>", "5<eos>", False)]


def test_a_kto_conversation_must_end_with_its_reply(char_tokenizer, tmp_path):
    rows = [{"conversations": [turn("gpt", "hello"), turn("human", "2+2=")], "kto_tag": True}]
    with pytest.raises(DataError, match=r"row 1: field 'conversations\[1\]\.from': expected the reply, a 'gpt' turn"):
        load_unpaired(write(tmp_path / "k.jsonl", rows), char_tokenizer, max_length=256)
    with pytest.raises(DataError, match=r"row 1: field 'kto_tag': expected true \(desirable\) or false"):
        load_unpaired(write(tmp_path / "k.jsonl", [{"instruction": "q", "output": "a", "kto_tag": "yes"}]),
                      char_tokenizer, max_length=256)


def test_sharegpt_turns_serve_as_prompts_anywhere_messages_do(char_tokenizer, tmp_path):
    pairs, _ = load_preferences(write(tmp_path / "p.jsonl", [{"prompt": [turn("human", "2+2=")], "chosen": "4",
                                                              "rejected": "5"}]), char_tokenizer, max_length=256)
    assert decode(char_tokenizer, pairs[0].prompt_ids) == "<|user|>2+2=<|assistant|>"
    (problem,) = load_prompts(write(tmp_path / "r.jsonl", [{"prompt": [turn("human", "2+2=")], "answer": "4"}]),
                              tokenizer=char_tokenizer)
    assert problem.prompt == "<|user|>2+2=<|assistant|>"


@pytest.mark.parametrize("row, where, expected", [
    ({"conversations": [turn("human", "q"), turn("bot", "a")]}, r"conversations\[1\]\.from", "one of 'human'"),
    ({"conversations": [turn("human", "q"), turn("gpt", "")]}, r"conversations\[1\]\.value", "a non-empty string"),
    ({"conversations": [turn("human", "q"), turn("function_call", "lookup(4821)")]}, r"conversations\[1\]\.value",
     "the JSON of a call"),
    ({"conversations": [turn("human", "q"), turn("gpt", "a")], "system": 3}, "system", "a string"),
    ({"instruction": "q", "output": 4}, "output", "a non-empty string"),
    ({"instruction": "q", "input": ["x"], "output": "a"}, "input", "a string"),
    ({"instruction": "q", "output": "a", "history": [["only a query"]]}, r"history\[0\]", "a \\[query, response\\] pair"),
])
def test_malformed_rows_name_the_field_as_written(char_tokenizer, tmp_path, row, where, expected):
    with pytest.raises(DataError, match=rf"row 1: field '{where}': expected {expected}"):
        load_sft(write(tmp_path / "bad.jsonl", [row]), char_tokenizer, max_length=256)


def test_a_json_file_may_be_an_array_of_rows_or_json_lines(char_tokenizer, tmp_path):
    """Alpaca's `alpaca_data.json` and LLaMA-Factory's datasets are JSON arrays; `datasets` reads a
    `.json` file as either."""
    rows = [{"instruction": "Add.", "input": "2+2", "output": "4"}, {"instruction": "Say yes.", "output": "yes"}]
    array = tmp_path / "alpaca_data.json"
    array.write_text(json.dumps(rows, indent=2))
    lines = tmp_path / "lines.json"
    lines.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for path in (array, lines):
        examples, report = load_sft(str(path), char_tokenizer, max_length=256)
        assert len(examples) == 2 and "kept 2" in report.summary()


@pytest.mark.parametrize("text, message", [
    ('[{"instruction": "q", "output": "a"}, 3]', r"row 2: expected a JSON object, got int"),
    ('[{"instruction": "q",\n  "output": }]', r"not valid JSON \(Expecting value at line 2, column 13\)"),
    ('{\n  "data": [{"instruction": "q", "output": "a"}]\n}', r"holds one JSON object; expected an array of row "
                                                            r"objects, or one object per line \(its rows may be the "
                                                            r"list under 'data'\)"),
])
def test_a_malformed_json_file_says_where(char_tokenizer, tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(DataError, match=message):
        load_sft(str(path), char_tokenizer, max_length=256)


def test_an_rl_prompt_ending_with_the_reply_is_refused(char_tokenizer, tmp_path):
    """SFT conversations reused as RL prompts: the model would be asked to go on after the answer."""
    rows = [{"conversations": [turn("human", "2+2="), turn("gpt", "4")], "answer": "4"}]
    with pytest.raises(DataError, match=r"row 1: field 'conversations\[1\]\.from': expected a prompt that ends with "
                                        r"a turn for the model to answer"):
        load_prompts(write(tmp_path / "r.jsonl", rows), prompt_field="conversations", tokenizer=char_tokenizer)


def test_only_the_fields_a_row_renders_count_toward_its_length(char_tokenizer, tmp_path):
    """Rows keep other columns (a raw `text` copy, a long `system` note ShareGPT rows would use):
    the cheap check before tokenizing counted them and refused short conversations as overlong."""
    long = "x" * 5000
    chat = [{"messages": [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}], "text": long,
             "system": long, "output": long}]
    (example,), _ = load_sft(write(tmp_path / "c.jsonl", chat), char_tokenizer, max_length=64)
    assert decode(char_tokenizer, example.input_ids) == "<|user|>2+2=<|assistant|>4<eos>"
    pairs = [{"prompt": "2+2=", "chosen": "4", "rejected": "5", "conversations": long, "instruction": long}]
    assert len(load_preferences(write(tmp_path / "p.jsonl", pairs), char_tokenizer, max_length=64)[0]) == 1
    kto = [{"prompt": "2+2=", "completion": c, "label": c == "4", "output": long} for c in ("4", "5")]
    assert len(load_unpaired(write(tmp_path / "k.jsonl", kto), char_tokenizer, max_length=64)[0]) == 2


def test_pairs_with_an_implicit_prompt_share_it_in_both_conversations(char_tokenizer, tmp_path, ext):
    """TRL's ultrafeedback and hh-rlhf rows: no prompt, each reply a whole conversation."""
    user = {"role": "user", "content": "2+2="}
    rows = [{"chosen": [user, {"role": "assistant", "content": "4"}],
             "rejected": [user, {"role": "assistant", "content": "5"}]}]
    (pair,), report = load_preferences(write(tmp_path / f"p.{ext}", rows), char_tokenizer, max_length=256)
    assert "shape 'chosen/rejected (implicit prompt)'" in report.summary()
    assert decode(char_tokenizer, pair.prompt_ids) == "<|user|>2+2=<|assistant|>"
    assert (decode(char_tokenizer, pair.chosen_ids), decode(char_tokenizer, pair.rejected_ids)) == ("4<eos>", "5<eos>")


@pytest.mark.parametrize("chosen, rejected, expected", [
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "4"}],
     [{"role": "user", "content": "b"}, {"role": "assistant", "content": "5"}], r"'chosen': expected a conversation "
                                                                                r"that shares its prompt"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "c"}],
     [{"role": "user", "content": "a"}, {"role": "assistant", "content": "5"}], r"'chosen': expected the 1 messages "
                                                                                r"shared with the other reply, then one "
                                                                                r"assistant message, got 2 messages"),
])
def test_an_implicit_prompt_that_is_not_one_is_refused_saying_why(char_tokenizer, tmp_path, chosen, rejected, expected):
    with pytest.raises(DataError, match=rf"row 1: field {expected}"):
        load_preferences(write(tmp_path / "p.jsonl", [{"chosen": chosen, "rejected": rejected}]), char_tokenizer,
                         max_length=256)


def test_pairs_of_two_texts_share_the_text_they_begin_with(char_tokenizer, tmp_path):
    """Anthropic's hh-rlhf as published: `chosen` and `rejected` are whole dialogues as text, with
    no prompt field. They were refused ("field 'prompt': ... no such field")."""
    rows = [{"chosen": "\n\nHuman: 2+2=\n\nAssistant: 4 it is", "rejected": "\n\nHuman: 2+2=\n\nAssistant: 45"},
            {"chosen": "Q: 12= A: 12", "rejected": "Q: 12= A: 21"}]
    pairs, report = load_preferences(write(tmp_path / "hh.jsonl", rows), char_tokenizer, max_length=256)
    assert "shape 'chosen/rejected (implicit text prompt)'" in report.summary()
    text = [tuple(decode(char_tokenizer, ids) for ids in (p.prompt_ids, p.chosen_ids, p.rejected_ids)) for p in pairs]
    # the cut goes back to the start of the word the replies differ in ("4" / "45"), the space with the reply
    assert text == [("\n\nHuman: 2+2=\n\nAssistant:", " 4 it is<eos>", " 45<eos>"), ("Q: 12= A:", " 12<eos>", " 21<eos>")]
    with pytest.raises(DataError, match="row 1: field 'chosen': expected a text that begins with the same prompt as "
                                        "'rejected', or a 'prompt' field, got no words in common at the start"):
        load_preferences(write(tmp_path / "none.jsonl", [{"chosen": "yes", "rejected": "no"}]), char_tokenizer,
                         max_length=256)
