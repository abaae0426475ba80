"""Other tools' dataset layouts: ShareGPT's `conversations` (from/value turns, LLaMA-Factory's
tool turns among them) and Alpaca's instruction/input/output rows, rendered with the chat
template; errors name the field as the file writes it."""

from __future__ import annotations

import json

import pytest

from lmpo.envs.data import DataError, load_preferences, load_sft
from lmpo.envs.data.prompts import load_prompts

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
