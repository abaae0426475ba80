"""Pair and KTO files in other columns (StackExchange's question/response_j/response_k): the
`--prompt_field`, `--chosen_field`, `--rejected_field` (pairs) and `--completion_field`,
`--label_field` (KTO) options read them, and a file without lmpo's names suggests them."""

import json

import pytest

from lmpo.cli.main import main
from lmpo.envs.data import DataError, load_preferences
from lmpo.envs.data.unpaired import load_unpaired

STACK_EXCHANGE = [{"qid": 1, "question": "What is 2+2?", "response_j": "4", "response_k": "5"},
                  {"qid": 2, "question": "Sort 312", "response_j": "123", "response_k": "321"}]
SE_COLUMNS = {"question": "prompt", "response_j": "chosen", "response_k": "rejected"}


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_renamed_columns_read_as_the_same_pairs(tmp_path, char_tokenizer):
    se = _write(tmp_path / "se.jsonl", STACK_EXCHANGE)
    plain = _write(tmp_path / "plain.jsonl", [{"prompt": r["question"], "chosen": r["response_j"],
                                               "rejected": r["response_k"]} for r in STACK_EXCHANGE])
    renamed, report = load_preferences(se, char_tokenizer, max_length=64, columns=SE_COLUMNS)
    expected, _ = load_preferences(plain, char_tokenizer, max_length=64)
    assert renamed == expected and report.kept == 2


def test_a_file_in_other_columns_suggests_the_options(tmp_path, char_tokenizer):
    se = _write(tmp_path / "se.jsonl", STACK_EXCHANGE)
    with pytest.raises(DataError) as err:
        load_preferences(se, char_tokenizer, max_length=64)
    assert "(--prompt_field question --chosen_field response_j --rejected_field response_k read the row's " \
           "'question', 'response_j' and 'response_k' columns)" in str(err.value)


def test_a_named_column_the_row_lacks_is_named_in_the_error(tmp_path, char_tokenizer):
    se = _write(tmp_path / "se.jsonl", STACK_EXCHANGE)
    with pytest.raises(DataError, match="row 1: field 'response_x': expected a string or messages"):
        load_preferences(se, char_tokenizer, max_length=64,
                         columns={"question": "prompt", "response_x": "chosen", "response_k": "rejected"})


def test_a_named_column_wins_over_one_already_called_chosen(tmp_path, char_tokenizer):
    rows = [{"prompt": "1+1?", "chosen": "old", "better": "2", "rejected": "3"}]
    path = _write(tmp_path / "both.jsonl", rows)
    (pair,), _ = load_preferences(path, char_tokenizer, max_length=64, columns={"better": "chosen"})
    assert char_tokenizer.decode(pair.chosen_ids, skip_special_tokens=True) == "2"


def test_kto_rows_in_other_columns(tmp_path, char_tokenizer):
    rows = [{"question": "2+2?", "response": "4", "thumbs_up": True},
            {"question": "2+3?", "response": "6", "thumbs_up": False}]
    path = _write(tmp_path / "kto.jsonl", rows)
    with pytest.raises(DataError, match=r"--prompt_field question reads the row's 'question' column"):
        load_unpaired(path, char_tokenizer, max_length=64)
    examples, _ = load_unpaired(path, char_tokenizer, max_length=64,
                                columns={"question": "prompt", "response": "completion", "thumbs_up": "label"})
    assert [e.desirable for e in examples] == [True, False]


def test_the_trainers_take_the_column_options(tmp_path, capsys):
    se = _write(tmp_path / "se.jsonl", STACK_EXCHANGE * 2)
    flags = ["--prompt_field", "question", "--chosen_field", "response_j", "--rejected_field", "response_k"]
    for command in ("dpo", "orpo", "rm"):
        out = tmp_path / command
        only = ["--heldout_pairs", "1"] if command == "rm" else ["--eval_problems", "0"]
        assert main(["train", command, "--model", "tiny", "--data", str(se), *flags, "--batch_size", "2", *only,
                     "--out", str(out)]) == 0, capsys.readouterr().err
        assert (out / "model" / "config.json").is_file()
    kto = _write(tmp_path / "kto.jsonl", [{"q": "2+2?", "r": "4", "ok": True}, {"q": "2+3?", "r": "6", "ok": False}])
    assert main(["train", "kto", "--model", "tiny", "--data", str(kto), "--prompt_field", "q", "--completion_field",
                 "r", "--label_field", "ok", "--batch_size", "2", "--eval_problems", "0",
                 "--out", str(tmp_path / "kto")]) == 0, capsys.readouterr().err


def test_column_options_without_a_data_file_are_refused(tmp_path, capsys):
    assert main(["train", "dpo", "--model", "tiny", "--chosen_field", "response_j", "--prompt_field", "question",
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "chosen_field='response_j' is only read with --data FILE" in err
    assert "prompt_field='question' is only read with --data FILE" in err
    assert not (tmp_path / "run").exists()


def test_online_dpo_has_no_pair_columns_and_its_prompt_field_is_the_prompt_files(capsys):
    with pytest.raises(SystemExit):
        main(["train", "online_dpo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--chosen_field" not in text
    assert "--prompt_field STR The column holding each prompt in --prompts and --eval_prompts files" in text


def test_lmpo_data_reads_pairs_in_other_columns(tmp_path, capsys):
    se = _write(tmp_path / "se.jsonl", STACK_EXCHANGE)
    assert main(["data", str(se), "--prompt_field", "question", "--chosen_field", "response_j",
                 "--rejected_field", "response_k"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"pairs: {se}: 2 rows, shape 'prompt/chosen/rejected' (field 'question'), kept 2")
    assert "[chosen]" in out and "[rejected]" in out


def test_two_column_options_naming_one_column_are_refused(tmp_path, capsys):
    se = _write(tmp_path / "se.jsonl", STACK_EXCHANGE)
    assert main(["train", "dpo", "--model", "tiny", "--data", str(se), "--prompt_field", "question", "--chosen_field",
                 "response_j", "--rejected_field", "response_j", "--out", str(tmp_path / "run")]) == 2
    assert "chosen_field and rejected_field both name the column 'response_j'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
