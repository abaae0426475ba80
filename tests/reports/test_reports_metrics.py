"""read_metrics and the series helpers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmpo.reports import read_metrics
from lmpo.reports.metrics import align, all_series, ema, series


def test_reads_rows_and_skips_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "loss": 1.0}\n\n{"step": 1, "loss": 0.5}\n')
    assert read_metrics(path) == [{"step": 0, "loss": 1.0}, {"step": 1, "loss": 0.5}]


def test_empty_file_gives_no_rows(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("")
    assert read_metrics(path) == []


def test_a_damaged_middle_line_is_skipped_with_a_warning_naming_file_and_line(tmp_path: Path) -> None:
    """A line damaged in the middle of the log raised, and `lmpo report` and `lmpo doctor` gave up
    on the whole run; now it is skipped as a truncated last line is, and the warning says so once."""
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1,, }\n{"step": 2}\n[1, 2]\n{"step": 4}\n')
    with pytest.warns(RuntimeWarning) as caught:
        rows = read_metrics(path)
    assert [r["step"] for r in rows] == [0, 2, 4]
    (message,) = [str(w.message) for w in caught]
    assert message.startswith(f"{path}: line 2: skipping damaged line (invalid JSON: ")
    assert message.endswith("(and 1 more damaged line); the report and the doctor read the other 3 rows")


def test_report_and_doctor_go_on_past_a_damaged_middle_line(tmp_path: Path, capsys) -> None:
    from lmpo.cli.main import main

    rows = [json.dumps({"step": s, "reward_mean": 0.5, "loss": 1.0 / s}) for s in range(1, 7)]
    rows[3] = rows[3][:20]
    (tmp_path / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    assert main(["report", str(tmp_path)]) == 0
    assert f"lmpo: warning: {tmp_path / 'metrics.jsonl'}: line 4: skipping damaged line" in capsys.readouterr().err
    html = (tmp_path / "report" / "report.html").read_text()
    # QA: the page said "5 rows logged" and nothing of the line it skipped (stderr alone did)
    assert "5 rows logged" in html and "line 4: skipping damaged line" in html
    assert main(["doctor", str(tmp_path)]) == 0
    assert "line 4: skipping damaged line" in capsys.readouterr().err


def test_truncated_last_line_is_skipped_with_warning(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "loss": 1.0}\n{"step": 1, "loss": 0.5}\n{"step": 2, "lo')
    with pytest.warns(RuntimeWarning, match=r"line 3: skipping truncated last line"):
        rows = read_metrics(path)
    assert [r["step"] for r in rows] == [0, 1]


def test_truncated_multibyte_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    good = json.dumps({"step": 0, "note": "é"}, ensure_ascii=False).encode() + b"\n"
    path.write_bytes(good + '{"step": 1, "note": "é'.encode()[:-1])
    with pytest.warns(RuntimeWarning):
        assert len(read_metrics(path)) == 1


def test_series_filters_and_sorts() -> None:
    rows = [
        {"step": 2, "a": 2.0},
        {"step": 0, "a": 0.0, "b": "text"},
        {"step": 1, "a": float("nan")},
        {"step": 2, "a": 3.0},  # resumed run re-logs step 2: later row wins
        {"a": 9.0},  # no step: falls back to the row index (4)
    ]
    assert series(rows, "a") == ([0.0, 2.0, 4.0], [0.0, 3.0, 9.0])
    assert "b" not in all_series(rows)


def test_ema_and_align() -> None:
    smoothed = ema([0.0, 10.0, 10.0, 10.0], span=3.0)
    assert smoothed[0] == 0.0 and 0.0 < smoothed[1] < smoothed[2] < smoothed[3] < 10.0
    assert ema([]) == []
    assert align(([1.0, 3.0], [5.0, 7.0]), [1.0, 2.0, 3.0]) == [5.0, 0.0, 7.0]


def test_the_command_line_says_lmpos_own_warnings_in_one_line(tmp_path: Path, capsys) -> None:
    from lmpo.cli.main import main

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 0.5}\n{"step": 3, "lo')
    assert main(["report", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert f"lmpo: warning: {tmp_path / 'metrics.jsonl'}: line 3: skipping truncated last line" in err
    assert "RuntimeWarning" not in err and "read_metrics(" not in err


def test_an_unterminated_string_is_said_without_a_doubled_at(tmp_path: Path) -> None:
    """json's "Unterminated string starting at" gave "starting at at column 13"."""
    from lmpo.reports.trajectories import read_trajectories

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1, "no')
    with pytest.warns(RuntimeWarning, match=r"\(invalid JSON: Unterminated string starting at column 13\)"):
        read_metrics(path)
    (tmp_path / "trajectories.jsonl").write_text('{"step": 1, "no')
    with pytest.warns(RuntimeWarning, match=r"trajectories\.jsonl:1: invalid JSON: Unterminated string starting at column 13$"):
        read_trajectories(tmp_path)


def test_a_value_of_the_wrong_type_is_warned_of_once_with_its_line_and_field(tmp_path: Path) -> None:
    """A hand-edited metrics.jsonl with "kl": "0.5", "entropy": true or "eval_accuracy": "50%"
    lost those values without a word."""
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 1, "kl": 0.1, "entropy": 1.0, "prompt_digest": "d684ccd3", "prompts": [0, 4]},
            {"step": 2, "kl": "0.5", "entropy": True, "stopped": "wall time"},
            {"step": "3", "kl": 0.2, "eval_accuracy": "50%", "rollback": "KL runaway", "to_step": None}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.warns(RuntimeWarning) as caught:
        assert len(read_metrics(path)) == 3
    assert [str(w.message) for w in caught] == [
        f"{path}: line 2: 'kl' is a string (\"0.5\") where a number belongs; the report and the doctor read "
        "numbers only (and 3 more such values)"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[:1]))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read_metrics(path)  # strings and lists of their own (digests, prompt ranges) are fine


def test_all_series_is_series_of_every_numeric_key() -> None:
    """`all_series` reads every key in one pass (a 100k-row file took 18 s key by key): the same
    points as `series`, in the order of `numeric_keys`, through repeated steps, NaN, booleans,
    strings and rows without a step."""
    import random

    from lmpo.reports.metrics import numeric_keys

    rng = random.Random(0)
    values = [0.5, -1, 3, float("nan"), float("inf"), True, "x", None, [1]]
    rows = []
    for i in range(400):
        row = {k: rng.choice(values) for k in rng.sample("abcdefg", rng.randint(0, 7))}
        if rng.random() < 0.9:
            row["step"] = rng.choice([rng.randint(0, 50), float("nan"), "3"])
        rows.append(row)
    expected = {k: series(rows, k) for k in numeric_keys(rows) if series(rows, k)[0]}
    got = all_series(rows)
    assert list(got) == list(expected) and got == expected


def guarded_rows() -> list[dict]:
    """Steps 1-4 trained, a rollback at 4 to step 0, steps 1-4 trained again. The kept run's step 2
    logs no `termination_answered` (none answered); the abandoned step 2 did."""
    first = [{"step": s, "zero_var_frac": 0.0, "termination_answered": 0.5, "termination_token_budget": 0.5}
             for s in range(1, 5)]
    again = [{"step": s, "zero_var_frac": 1.0, "termination_answered": 0.25, "termination_token_budget": 0.75}
             for s in range(1, 5)]
    del again[1]["termination_answered"]
    again[1]["termination_token_budget"] = 1.0
    return [{"step": 0, "eval_accuracy": 0.5, "eval_termination_answered": 0.8, "eval_termination_token_budget": 0.2},
            *first, {"step": 4, "rollback": "KL runaway", "to_step": 0, "lr_scale": 0.5}, *again,
            {"step": 4, "eval_accuracy": 0.0, "eval_termination_token_budget": 1.0}]


def test_the_kept_rows_are_the_final_branch_with_unlogged_shares_as_0() -> None:
    """After a rollback a key the kept run did not log at a step was read from the abandoned branch
    (a termination stack of 112%, QA F2), and a share of 0 was missing, not 0 (QA F3)."""
    from lmpo.reports.metrics import kept_rows
    from lmpo.reports.rollbacks import without_rollbacks

    rows = kept_rows(guarded_rows())
    assert [r["step"] for r in rows] == [0, 4, 1, 2, 3, 4, 4] and "rollback" in rows[1]
    data = all_series(without_rollbacks(rows))
    assert data["zero_var_frac"] == ([1.0, 2.0, 3.0, 4.0], [1.0] * 4)
    assert data["termination_answered"] == ([1.0, 2.0, 3.0, 4.0], [0.25, 0.0, 0.25, 0.25])
    assert data["eval_termination_answered"] == ([0.0, 4.0], [0.8, 0.0])  # the fall to 0 is drawn


def test_two_rollbacks_undo_everything_after_the_earliest_step_they_went_back_to() -> None:
    from lmpo.reports.metrics import final_branch

    rows = [{"step": s, "x": "a"} for s in range(1, 7)] + [{"step": 6, "rollback": "r", "to_step": 4}]
    rows += [{"step": 5, "x": "b"}, {"step": 5, "rollback": "r", "to_step": 2}, {"step": 3, "x": "c"}]
    assert [(r["step"], r.get("x")) for r in final_branch(rows)] == [(1, "a"), (2, "a"), (6, None), (5, None),
                                                                   (3, "c")]


def test_the_report_table_reads_the_kept_run(tmp_path: Path) -> None:
    from lmpo.reports import write_report

    path = tmp_path / "run" / "metrics.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(r) + "\n" for r in guarded_rows()))
    html = write_report(path.parent).read_text()
    row = html[html.index(">termination_answered<"):].split("</tr>")[0]
    cells = [c.split(">")[-1] for c in row.split("</td>")[:-1]]
    assert cells[1:] == ["0.25", "4", "0", "0.25", "4"]  # last, at step, min, max, points
