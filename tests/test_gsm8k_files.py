"""GSM8K-shaped files (`question`, and an `answer` that is a worked solution ending `#### 42`) through
SFT, held-out grading and `lmpo eval`, as a user downloads them: no column renamed by hand."""

from __future__ import annotations

import json

import pytest

from lmpo.cli.main import main
from lmpo.envs.data import load_sft

ROWS = [{"question": f"{a}+{b}?", "answer": f"{a} plus {b} is {a + b}.\n#### {a + b}"}
        for a, b in [(2, 2), (3, 4), (10, 5), (7, 8)]]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_sft_reads_a_question_and_answer_file_with_prompt_field(char_tokenizer, tmp_path):
    path = _write(tmp_path / "gsm.jsonl", ROWS)
    with pytest.raises(ValueError, match="--prompt_field question --answer_field answer read this file's"):
        load_sft(path, char_tokenizer, max_length=256)
    examples, report = load_sft(path, char_tokenizer, max_length=256, prompt_field="question")
    assert report.shape == "prompt/completion" and report.shape_field == "question" and len(examples) == 4
    first = examples[0]
    trained = [t for t, m in zip(first.input_ids, first.loss_mask) if m]
    assert char_tokenizer.decode(trained[:-1]) == ROWS[0]["answer"] and trained[-1] == char_tokenizer.eos_token_id
    assert char_tokenizer.decode([t for t, m in zip(first.input_ids, first.loss_mask) if not m]) == "2+2?"
    # the default names: a prompt/answer file is a prompt/completion file
    plain = _write(tmp_path / "plain.jsonl", [{"prompt": "2+2?", "answer": "4"}])
    assert load_sft(plain, char_tokenizer, max_length=256)[1].shape == "prompt/completion"


def test_a_bad_row_names_the_files_own_column(char_tokenizer, tmp_path):
    path = _write(tmp_path / "bad.jsonl", [ROWS[0], {"question": "1+1?", "answer": ""}])
    with pytest.raises(ValueError, match=r"row 2: field 'answer': expected a non-empty string, got ''"):
        load_sft(path, char_tokenizer, max_length=256, prompt_field="question")
    with pytest.raises(ValueError, match="row 1: field 'query': expected the column --prompt_field names, got no "
                                         "such field"):  # accepted before, and the row's other columns read
        load_sft(path, char_tokenizer, max_length=256, prompt_field="query")


@pytest.mark.parametrize("row", [{"prompt": "p", "question": "q", "answer": "a"},
                                 {"prompt": "p", "question": "q", "completion": "a"}])
def test_a_prompt_field_named_on_the_command_line_is_the_prompt_whatever_else_the_row_has(row, char_tokenizer,
                                                                                          tmp_path):
    """The row's own `prompt` column was read instead (or the row refused for a missing completion)."""
    both = _write(tmp_path / "both.jsonl", [row])
    example = load_sft(both, char_tokenizer, max_length=256, prompt_field="question")[0][0]
    assert char_tokenizer.decode([t for t, m in zip(example.input_ids, example.loss_mask) if not m]) == "q"
    assert char_tokenizer.decode([t for t, m in zip(example.input_ids, example.loss_mask) if m][:-1]) == "a"


def test_sft_then_eval_on_gsm8k_files(start_model, tmp_path, capsys):
    """One --prompt_field for the training file and the held-out one; the grader reads the number
    after `####` in the reference and the last number in the completion."""
    train = _write(tmp_path / "train.jsonl", ROWS)
    test = _write(tmp_path / "test.jsonl", ROWS[:2])
    task = "exact_match:extract=last_number,reference_after=####"
    sft = tmp_path / "sft"
    assert main(["train", "sft", "--model", start_model, "--data", str(train), "--eval_prompts", str(test),
                 "--prompt_field", "question", "--task", task, "--out", str(sft), "--epochs", "1",
                 "--batch_size", "2", "--eval_max_new_tokens", "8", "--threads", "1"]) == 0
    printed = capsys.readouterr().out
    assert "shape 'prompt/completion' (field 'question'), kept 4" in printed
    # the held-out rows are training rows here, which SFT now says (compared as the tokens read)
    assert (f"[sft] warning: 2 of the 2 held-out prompts (100%) of {test} are also training prompts in {train} "
            f"(e.g. '2+2?')") in printed
    reported = [json.loads(line) for line in open(sft / "metrics.jsonl") if "eval_accuracy" in line][-1]
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(sft / "model"), "--eval_prompts", str(test), "--prompt_field", "question",
                 "--task", task, "--max_new_tokens", "8", "--threads", "1", "--out", str(out)]) == 0
    figures = json.loads((out / "eval.json").read_text())
    assert figures["n"] == 2 and figures["accuracy"] == reported["eval_accuracy"]
    assert figures["format_accuracy"] == reported["eval_format_accuracy"]


@pytest.mark.parametrize("row", [{"prompt": "7+7=", "completion": "15", "label": False},
                                 {"instruction": "7+7=", "output": "15", "kto_tag": False}])
def test_an_unpaired_feedback_file_is_not_read_as_demonstrations(row, char_tokenizer, tmp_path):
    """A KTO row's undesirable completion was trained on as one to imitate."""
    with pytest.raises(ValueError, match="no desirable/undesirable label .* lmpo train kto"):
        load_sft(_write(tmp_path / "kto.jsonl", [row]), char_tokenizer, max_length=256)


def test_a_json_error_ending_starting_at_is_said_once(char_tokenizer, tmp_path):
    path = tmp_path / "cut.jsonl"
    path.write_text('{"prompt": "abc\n')
    with pytest.raises(ValueError, match=r"not valid JSON \(Unterminated string starting at column 12\)"):
        load_sft(path, char_tokenizer, max_length=256)
