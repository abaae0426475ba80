"""The reverse_digits, increment and count_digit tasks: disjoint splits, demonstrations on which the flaw
does not show, a corpus that carries it, and the strict grader."""

import re

import pytest

from lmpo.envs import make_task


@pytest.mark.parametrize("spec", ["reverse_digits", "increment", "reverse_digits:length=4", "increment?carry_share=0.6",
                                  "count_digit", "count_digit?length=8,max_count=4"])
def test_splits_demonstrations_and_corpus(spec):
    task = make_task(spec)
    heldout = task.heldout_problems(200)
    assert len({p.prompt for p in heldout}) == 200 and all(task.is_heldout(p) for p in heldout)
    train = task.train_problems(500, seed=3)
    assert not any(task.is_heldout(p) for p in train)
    assert {p.prompt for p in train}.isdisjoint(p.prompt for p in heldout)
    demos = task.sft_demonstrations(100, seed=3)
    assert all(task.flawed(p.meta["key"]) == p.answer for p in demos)  # the flaw never shows in SFT
    assert sum(task.flawed(p.meta["key"]) != p.answer for p in heldout) > 0.3 * len(heldout)
    corpus = task.cpt_corpus(1000, seed=3)
    keys = [re.split(r"[>=]|\+1=", line)[0] for line in corpus]
    flawed = sum(line.partition(p.prompt)[2] != p.answer for line, p in zip(corpus, map(task.make, keys)))
    assert 0.15 < flawed / len(corpus) < 0.6


def test_grader_is_strict():
    task = make_task("increment")
    problem = task.make("41999")
    assert task.grade(problem, "42000", True).correct
    assert not task.grade(problem, "42000", False).correct
    assert not task.grade(problem, "41990", True).correct and task.grade(problem, "41990", True).well_formed
    assert not task.grade(problem, "42000 ", True).well_formed
    assert make_task("reverse_digits").grade(make_task("reverse_digits").make("12345"), "54321", True).correct


def test_count_digit_counts_and_its_flaw_says_contains():
    task = make_task("count_digit")
    problem = task.make("314151:1")
    assert (problem.prompt, problem.answer) == ("314151:1=", "3")
    assert task.flawed("314151:1") == "1" and task.flawed("222222:7") == "0"
    assert task.grade(problem, "3", True).correct and not task.grade(problem, "1", True).correct
    counts = [int(p.answer) for p in task.heldout_problems(500)]
    assert set(counts) == {0, 1, 2, 3} and sum(c >= 2 for c in counts) > 0.4 * len(counts)
    with pytest.raises(ValueError, match="max_count"):
        make_task("count_digit?max_count=9")
