"""RL on a user's own prompt file: extra columns reach reward functions, the exact_match
grader scores the answer column, and a separate file gives the held-out evaluation."""

from __future__ import annotations

import json

import pytest

from lmpo.envs import make_task
from lmpo.envs.base import Problem
from lmpo.trainers.rl import train_rl
from lmpo.trainers.rl_config import RLConfig


def weight_column(task, problems, completions, terminated):
    """A reward read from the prompt file's own `weight` column."""
    return [float(p.meta["weight"]) for p in problems]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_exact_match_grades_the_answer_column():
    task = make_task("exact_match")
    p = Problem("2+2=", " 4 ")
    assert task.grade(p, "4", True).correct and not task.grade(p, "4", False).correct
    assert not task.grade(p, "5", True).correct and task.grade(p, "5", True).well_formed
    assert make_task("exact_match:ignore_case=1").grade(Problem("q", "Yes"), "yes", True).correct
    with pytest.raises(ValueError, match="--prompts"):
        task.train_problems(4, 0)


def test_rl_trains_on_a_prompt_file_with_extra_columns(start_model, tmp_path):
    rows = [{"prompt": f"{d}=", "answer": "".join(sorted(d)), "weight": w}
            for d, w in [("31415", 1.0), ("27182", 3.0), ("16180", 1.0), ("14142", 3.0)]]
    train = _write(tmp_path / "train.jsonl", rows)
    heldout = _write(tmp_path / "heldout.jsonl", [{"prompt": "55123=", "answer": "12355"}])
    cfg = RLConfig(model=str(start_model), out=str(tmp_path / "rl"), task="exact_match", prompts=str(train),
                   eval_prompts=str(heldout), eval_problems=10, eval_every=2, steps=2, prompts_per_step=2,
                   group_size=2, max_new_tokens=6, save_every=0, threads=1, reward_timeout=0,
                   rewards=f"correct=1.0,{__name__}:weight_column=1.0")
    train_rl(cfg)
    metrics = [json.loads(line) for line in open(tmp_path / "rl" / "metrics.jsonl")]
    steps = [r for r in metrics if "reward_mean" in r]
    # two steps of two prompts are one pass over the four rows: the step means average to the column's mean, 2
    per_step = [r[f"reward_{__name__}:weight_column"] for r in steps]
    assert all(v in (1.0, 2.0, 3.0) for v in per_step) and sum(per_step) / 2 == 2.0
    evals = [r for r in metrics if "eval_accuracy" in r]
    assert [r["step"] for r in evals] == [0, 2]


def test_a_bad_prompt_file_names_the_row_and_field(start_model, tmp_path):
    bad = _write(tmp_path / "bad.jsonl", [{"prompt": "1=", "answer": "1"}, {"answer": "2"}])
    cfg = RLConfig(model=str(start_model), out=str(tmp_path / "rl"), task="exact_match", prompts=str(bad),
                   eval_problems=0, steps=1, prompts_per_step=1, group_size=2, threads=1, reward_timeout=0)
    with pytest.raises(Exception, match=r"bad.jsonl: row 2: field 'prompt'"):
        train_rl(cfg)


def test_an_unimportable_reward_function_is_a_clear_error():
    from lmpo.envs import parse_reward_weights, reward_functions

    with pytest.raises(ValueError, match="cannot import module 'no_such_module'"):
        reward_functions(parse_reward_weights("no_such_module:fn=1.0"))
    with pytest.raises(ValueError, match=f"module '{__name__}' has no function 'missing'"):
        reward_functions(parse_reward_weights(f"{__name__}:missing=1.0"))
