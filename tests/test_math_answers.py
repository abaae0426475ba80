"""Grading math answers as models write them: `exact_match:extract=boxed|last_number`, `math=1`
and `reference_extract=` (lmpo/envs/answers.py). Before these, an instruct model's
`\\boxed{1,000}` never matched a GSM8K answer of `1000`, so every reward was 0."""

from __future__ import annotations

from fractions import Fraction

import pytest

from lmpo.envs import make_task
from lmpo.envs.answers import as_number, last_boxed, last_number, same_answer
from lmpo.envs.base import Problem

GSM8K = Problem("Janet buys 4 boxes of 250 nails ...", "4 boxes of 250 nails is 4*250 = <<4*250=1000>>1000 nails.\n#### 1000")


def test_the_last_boxed_answer_with_its_braces_balanced():
    assert last_boxed("so \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert last_boxed("first \\boxed{3}, then \\fbox{x^{2}}") == "x^{2}"
    assert last_boxed("\\boxed 5$.") == "5"
    assert last_boxed("\\boxed{never closed") is None
    assert last_boxed("no box here") is None


def test_the_last_number_as_written():
    assert last_number("4 boxes of 250 is $1,000.") == "1,000"
    assert last_number("It drops by -3, then 4.5 more") == "4.5"
    assert last_number("That is 1\\,000 nails") == "1000"  # LaTeX's thin space as the separator
    assert last_number("the share is 50%") == "50"
    assert last_number("x2 and y") is None  # part of a name, not a number
    assert last_number("no digits") is None


def test_numbers_compare_by_value_and_anything_else_as_text():
    assert as_number("$1,000.00") == 1000 and as_number("\\$18") == 18 and as_number("50\\%") == 50
    assert as_number("-\\frac{1}{2}") == Fraction(-1, 2) == as_number("-1/2") == as_number("-.5")
    assert as_number("\\dfrac{3}{4}") == Fraction(3, 4)
    assert as_number("18 \\text{ dollars}") == 18 == as_number("x = 18") == as_number("$y=18$")
    assert as_number("xy = 18") is None and as_number("3 + x = 5") is None
    assert as_number("(1,2)") is None and as_number("1,2") is None and as_number("3/0") is None
    assert same_answer("1,000", "1000", math=True) and not same_answer("1,000", "1000", math=False)
    assert same_answer("\\left( 1, 2 \\right)", "(1,2)", math=True)  # as text, spacing aside
    assert same_answer("\\dfrac{\\pi}{2}", "\\frac{\\pi}{2}", math=True)
    assert not same_answer("(1,2)", "(2,1)", math=True)


def test_gsm8k_graded_by_the_last_number_of_a_worked_answer():
    task = make_task("exact_match:extract=last_number,reference_after=####")
    assert task.grade(GSM8K, "4 boxes of 250 nails make 4 * 250 = 1,000 nails.", True).correct
    assert task.grade(GSM8K, "So Janet has $1000.00 worth.", True).correct
    wrong = task.grade(GSM8K, "1000 nails, minus 250 lost, leaves 750", True)
    assert not wrong.correct and wrong.well_formed
    no_number = task.grade(GSM8K, "I cannot tell.", True)
    assert not no_number.correct and not no_number.well_formed
    assert not task.grade(GSM8K, "1000", False).correct  # cut off by the token budget


def test_a_boxed_answer_graded_by_value():
    """Qwen2.5-Instruct and DeepSeek-R1 end with `\\boxed{...}`; MATH's solutions too."""
    problem = Problem("What is 3/4 as a decimal?", "0.75")
    boxed = make_task("exact_match:extract=boxed,math=1")
    assert boxed.grade(problem, "Dividing, we get $\\boxed{\\dfrac{3}{4}}$.", True).correct
    assert boxed.grade(problem, "\\boxed{.75}", True).correct
    assert not make_task("exact_match:extract=boxed").grade(problem, "\\boxed{3/4}", True).correct  # text
    unboxed = boxed.grade(problem, "It is 0.75.", True)
    assert not unboxed.correct and not unboxed.well_formed
    math_solution = Problem("Solve 4x = 3.", "Dividing both sides by 4, $x = \\boxed{\\frac{3}{4}}$.")
    from_solution = make_task("exact_match:extract=boxed,reference_extract=boxed,math=1")
    assert from_solution.grade(math_solution, "So \\boxed{0.75}", True).correct
    assert not from_solution.grade(math_solution, "So \\boxed{4/3}", True).correct


def test_the_answer_after_the_thinking_is_the_one_extracted():
    task = make_task("exact_match:answer_after=</think>,extract=boxed,math=1")
    problem = Problem("6*7?", "42")
    assert task.grade(problem, "<think>maybe \\boxed{41}</think>The answer is \\boxed{42}.", True).correct
    inside = task.grade(problem, "<think>it is \\boxed{42}</think>forty-two", True)
    assert not inside.correct and not inside.well_formed


@pytest.mark.parametrize("spec, message", [
    ("exact_match:extract=box", "extract must be one of boxed, last_number; got 'box'"),
    ("exact_match:reference_extract=number", "reference_extract must be one of boxed, last_number"),
    ("exact_match:reference_after=####,reference_extract=boxed", "reference_after or reference_extract, not both"),
])
def test_a_misspelt_grading_option_is_an_error_naming_it(spec, message):
    with pytest.raises(ValueError, match=message):
        make_task(spec)


def test_the_cli_refuses_a_misspelt_extract_before_training(start_model, tmp_path, capsys):
    from lmpo.cli.main import main

    prompts = tmp_path / "gsm.jsonl"
    prompts.write_text('{"prompt": "2+2?", "answer": "#### 4"}\n')
    assert main(["train", "grpo", "--model", start_model, "--task", "exact_match:extract=last_num",
                 "--prompts", str(prompts), "--eval_problems", "0", "--out", str(tmp_path / "rl")]) == 2
    assert "extract must be one of boxed, last_number; got 'last_num'" in capsys.readouterr().err
    assert not (tmp_path / "rl" / "model").exists()


def test_a_numeric_answer_column_is_read_as_its_number(tmp_path):
    """A Parquet or pandas answer column of numbers is a float column (42.0; NaN where missing):
    it was refused ("a string or an integer")."""
    import pandas as pd

    from lmpo.envs.data.prompts import load_prompts

    path = tmp_path / "numbers.parquet"
    pd.DataFrame({"prompt": ["a", "b", "c"], "answer": [2.5, 42.0, 1e-05]}).to_parquet(path)
    problems = load_prompts(path, require_answer=True)
    assert [p.answer for p in problems] == ["2.5", "42", "1e-05"]
    task = make_task("exact_match:extract=last_number")
    assert [task.grade(p, text, True).correct for p, text in zip(problems, ["2.50", "42", "0.00001"])] == [True] * 3
    missing = tmp_path / "missing.jsonl"
    missing.write_text('{"prompt": "a", "answer": 1.5}\n{"prompt": "b", "answer": NaN}\n')
    assert [p.answer for p in load_prompts(missing)] == ["1.5", ""]
    with pytest.raises(ValueError, match=r"row 2: field 'answer': .* got NaN \(a missing value"):
        load_prompts(missing, require_answer=True)
