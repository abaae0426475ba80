"""`lmpo data FILE`: a file as its trainer reads it, the tokens that carry loss marked."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lmpo.cli.main import main


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def run(capsys, *args) -> tuple[int, str, str]:
    code = main(["data", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_chat_file_shows_its_shape_counts_and_where_the_loss_is(tmp_path, capsys):
    rows = [{"messages": [{"role": "user", "content": f"{a}+1="}, {"role": "assistant", "content": str(a + 1)}]}
            for a in range(10)]
    code, out, _ = run(capsys, _write(tmp_path / "chat.jsonl", rows), "--show", "1")
    assert code == 0
    assert "sft: " in out and "10 rows, shape 'messages'" in out
    assert "tokens per example: min 8, median 8, p95 9, max 9; limit: the model's context of 256 tokens" in out
    # output piped: no colour, so the loss tokens are marked
    assert "example 1 (8 tokens, 2 with loss)\n<|user|>0+1=<|assistant|>«1<eos>»" in out
    assert "example 2" not in out


@pytest.mark.parametrize("rows, kind, shown", [
    ([{"prompt": "2+2=", "chosen": "4", "rejected": "5"}], "pairs",
     "(6 tokens with the longer reply; the two replies' 4 carry loss)\n2+2=\n[chosen] «4<eos>»\n[rejected] «5<eos>»"),
    ([{"prompt": "2+2=", "completion": "4", "label": True}, {"prompt": "2+2=", "completion": "5", "label": False}],
     "kto", "2+2=\n[desirable] «4<eos>»"),
    ([{"prompt": "2+2=", "answer": "4"}], "prompts", "example 1 (4 tokens, 0 with loss)\n2+2=\n[answer: '4']"),
])
def test_each_kind_is_found_from_its_fields_and_shown_as_its_trainer_reads_it(tmp_path, capsys, rows, kind, shown):
    code, out, _ = run(capsys, _write(tmp_path / "d.jsonl", rows))
    assert code == 0 and out.startswith(f"{kind}: ") and shown in out


def test_rows_over_the_limit_are_counted_not_refused(tmp_path, capsys):
    rows = [{"prompt": "1+1=", "completion": "2"}, {"prompt": "1" * 40 + "=", "completion": "2"}]
    code, out, _ = run(capsys, _write(tmp_path / "d.jsonl", rows), "--max_length", "20", "--show", "0")
    assert code == 0 and "kept 1" in out
    assert "warning: 1 rows are over max_length 20: a trainer stops at the first of them" in out


def test_a_bad_file_is_an_error_naming_the_row(tmp_path, capsys):
    code, _, err = run(capsys, _write(tmp_path / "d.jsonl", [{"messages": "hi"}]), "--kind", "sft")
    assert code == 2 and "row 1: field 'messages': expected a list of {role, content} objects" in err


def test_the_readmes_example_prints_what_the_readme_shows(tmp_path, capsys, monkeypatch):
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    block = re.search(r"\n((?:    \$ printf.*\n)(?:    .*\n|\n)*?)\n(?! )", readme).group(1)
    lines = [line[4:] for line in block.splitlines()]
    row = re.search(r"'%s\\n' '(.*)' > chat.jsonl", lines[0]).group(1)
    assert lines[1] == "$ lmpo data chat.jsonl --show 1"
    monkeypatch.chdir(tmp_path)
    Path("chat.jsonl").write_text(row + "\n")
    code, out, _ = run(capsys, "chat.jsonl", "--show", "1")
    assert code == 0 and out.splitlines() == lines[2:]


def test_overlong_shows_what_each_policy_of_the_trainers_leaves(tmp_path, capsys):
    """`--overlong` as the trainers take it: error (the default) counts the rows over the limit
    and says a trainer stops at them, skip drops them, truncate cuts them. Before, the summary
    read "(skip): 1 skipped" beside a warning that a trainer stops, and truncation could not be
    previewed. Prompt files have no such option and refuse it."""
    rows = [{"prompt": "1+1=", "completion": "2"}, {"prompt": "1=", "completion": "2" * 40}]
    path = _write(tmp_path / "d.jsonl", rows)
    code, out, _ = run(capsys, path, "--max_length", "20", "--show", "0")
    assert code == 0 and "kept 1; over max_length 20: 1 row\n" in out and "a trainer stops at the first" in out
    code, out, _ = run(capsys, path, "--max_length", "20", "--show", "0", "--overlong", "skip")
    assert code == 0 and "(skip): 1 skipped, 0 truncated" in out and "warning" not in out
    code, out, _ = run(capsys, path, "--max_length", "20", "--show", "2", "--overlong", "truncate")
    assert code == 0 and "kept 2; over max_length 20 (truncate): 0 skipped, 1 truncated" in out
    assert "example 2 (20 tokens" in out
    code, _, err = run(capsys, _write(tmp_path / "p.jsonl", [{"prompt": "2+2="}]), "--overlong", "skip")
    assert code == 2 and "--overlong skip: the prompt trainers have no such option" in err


def test_trust_remote_code_takes_a_value_as_the_trainers_do(tmp_path, capsys):
    """`lmpo data FILE --trust_remote_code true`, as the trainers take it, was "unrecognized arguments: true"."""
    path = _write(tmp_path / "d.jsonl", [{"prompt": "2+2=", "answer": "4"}])
    code, out, _ = run(capsys, path, "--trust_remote_code", "false", "--show", "0")
    assert code == 0 and out.startswith("prompts: ")


def test_a_prompt_file_is_checked_as_the_trainer_of_its_task_checks_it(tmp_path, capsys):
    """A row without an answer passed `lmpo data` ("2 prompts", rc 0), and `lmpo train grpo --task
    exact_match` then refused the file. Without --task the rows lacking an answer (absent, null or
    "") are a warning (unless no row has the field: a task with its own grader); --task
    exact_match refuses as its trainer."""
    path = _write(tmp_path / "p.jsonl", [{"prompt": "12=", "answer": "12"}, {"prompt": "34="}])
    refused = ("p.jsonl: row 2: field 'answer': expected the answer the grader compares completions with "
               "(task exact_match; ")
    code, out, _ = run(capsys, path, "--show", "0")
    assert code == 0 and "2 prompts" in out
    assert "warning: 1 of 2 rows have no answer: a task that grades against answers refuses the file " \
           "(--task exact_match checks it as its trainer does): " in out and refused in out
    code, _, err = run(capsys, path, "--task", "exact_match:extract=last_number", "--show", "0")
    assert code == 2 and refused in err
    code, out, _ = run(capsys, path, "--task", "sort_digits", "--show", "0")
    assert code == 0 and "warning" not in out
    code, out, _ = run(capsys, _write(tmp_path / "none.jsonl", [{"prompt": "12="}]), "--show", "0")
    assert code == 0 and "warning" not in out
    # an answer column left null or empty in every row is not a prompt set without answers: it was said of none
    empty = _write(tmp_path / "empty.jsonl", [{"prompt": "12=", "answer": None}, {"prompt": "34=", "answer": ""}])
    code, out, _ = run(capsys, empty, "--show", "0")
    assert code == 0 and "warning: 2 of 2 rows have no answer: a task that grades against answers" in out
    mixed = _write(tmp_path / "mixed.jsonl", [{"prompt": "12=", "answer": "12"}, {"prompt": "34=", "answer": None},
                                              {"prompt": "56=", "answer": ""}, {"prompt": "78="}])
    code, out, _ = run(capsys, mixed, "--show", "0")
    assert code == 0 and "warning: 3 of 4 rows have no answer" in out
    code, _, err = run(capsys, path, "--task", "exact_match:extract=nope")
    assert code == 2 and "exact_match: extract must be one of" in err
    code, _, err = run(capsys, path, "--task", "exact_match", "--kind", "sft")
    assert code == 2 and "--task: only prompt files are read with a task (--kind prompts), not --kind sft" in err


def test_a_data_file_error_is_the_loaders_not_a_traceback(tmp_path, capsys):
    """An unclosed CSV quote read 4 rows as 2 prompts; a lone surrogate was a tokenizers TypeError."""
    csv = tmp_path / "u.csv"
    csv.write_text('prompt,answer\n1=,1\n"3=,3\n4=,4\n5=,5\n')
    code, _, err = run(capsys, str(csv), "--show", "3")
    assert code == 2 and "u.csv: line 3: a quoted value opened here is never closed" in err
    surrogate = tmp_path / "s.jsonl"
    surrogate.write_text('{"prompt":"12=\\ud800","answer":"12"}\n')
    code, _, err = run(capsys, str(surrogate))
    assert code == 2 and "s.jsonl: row 1: field 'prompt': not valid Unicode (a lone surrogate \\ud800 at character 3" in err


def test_the_token_counts_share_one_number_format():
    """A median of 2000000 was printed as 2e+06 beside min 2000000 (`:g`)."""
    from lmpo.reports.data_view import Shown, counts_line

    long = [Shown([], length=2_000_000)]
    assert counts_line(long, "none").startswith("tokens per example: min 2000000, median 2000000, p95 2000000,")
    assert ", median 3.5, " in counts_line([Shown([], length=3), Shown([], length=4)], "none")
