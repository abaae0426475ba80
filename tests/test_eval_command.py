"""`lmpo eval`: a model's held-out accuracy without training, measured as the trainers measure it."""

from __future__ import annotations

import json

from lmpo.cli.main import main
from lmpo.reports.trajectories import read_trajectories


def test_eval_scores_a_stage_model_as_its_run_reported(tmp_path, capsys):
    """The SFT stage's last held-out figures, and `lmpo eval` of its model on the same problems."""
    sft = tmp_path / "sft"
    assert main(["train", "sft", "--model", "tiny", "--out", str(sft), "--demonstrations", "300", "--epochs", "4",
                 "--lr", "3e-3", "--eval_problems", "60", "--threads", "1"]) == 0
    reported = [json.loads(line) for line in open(sft / "metrics.jsonl") if "eval_accuracy" in line][-1]
    assert 0.1 < reported["eval_accuracy"] < 0.9  # a figure that can disagree
    capsys.readouterr()
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(sft / "model"), "--eval_problems", "60", "--threads", "1",
                 "--out", str(out), "--show", "2"]) == 0
    printed = capsys.readouterr().out
    figures = json.loads((out / "eval.json").read_text())
    assert figures["n"] == 60 and figures["accuracy"] == reported["eval_accuracy"]
    assert figures["format_accuracy"] == reported["eval_format_accuracy"]
    assert {f"eval_termination_{k}": v for k, v in figures["terminations"].items()} == \
        {k: v for k, v in reported.items() if k.startswith("eval_termination_")}
    right = round(60 * reported["eval_accuracy"])
    assert f"accuracy {100 * reported['eval_accuracy']:.1f}% ({right} of 60)" in printed
    rows = read_trajectories(out)
    assert len(rows) == 60 and sum(r["correct"] for r in rows) == right
    assert printed.count("· wrong ·") == 2  # the failed episodes are shown first


def test_eval_grades_a_prompt_file_with_its_task(start_model, tmp_path, capsys):
    """A file of prompts whose answers are half the model's own greedy completions: 50%, and the
    other half listed by `lmpo trajectories --failed`."""
    probe = tmp_path / "probe.jsonl"
    prompts = [f"{n}=" for n in (31415, 27182, 16180, 14142, 17320, 22360)]
    probe.write_text("".join(json.dumps({"prompt": p, "answer": "x"}) + "\n" for p in prompts))
    common = ["eval", "--model", start_model, "--max_new_tokens", "4", "--threads", "1"]
    assert main([*common, "--task", "exact_match", "--eval_prompts", str(probe), "--out", str(tmp_path / "probe")]) == 0
    said = {r["prompt"]: "".join(s["text"] for s in r["segments"] if s["source"] == "model")
            for r in read_trajectories(tmp_path / "probe")}
    # a random model never writes EOS, which exact_match demands: a task of this file grades without it
    rows = [{"prompt": p, "answer": said[p] if i % 2 == 0 else said[p] + "!"} for i, p in enumerate(prompts)]
    graded = tmp_path / "graded.jsonl"
    graded.write_text("".join(json.dumps(r) + "\n" for r in rows))
    capsys.readouterr()
    assert main([*common, "--task", f"{__file__}:Unterminated", "--eval_prompts", str(graded),
                 "--out", str(tmp_path / "graded"), "--show", "0"]) == 0
    assert "accuracy 50.0% (3 of 6)" in capsys.readouterr().out
    assert main(["trajectories", str(tmp_path / "graded"), "--failed", "--last", "0"]) == 0
    assert "showing 3 of 3 matching trajectories" in capsys.readouterr().out


class Unterminated:
    """exact_match's comparison without its demand for EOS."""

    name = "unterminated"

    def grade(self, problem, completion, terminated):
        from lmpo.envs.base import Grade

        return Grade(correct=completion.strip() == problem.answer.strip(), well_formed=True)

    def is_heldout(self, problem):
        return False


def test_eval_refuses_what_it_cannot_evaluate(start_model, tmp_path, capsys):
    assert main(["eval", "--model", start_model, "--eval_problems", "0"]) == 2
    assert "eval_problems=0 must be >= 1" in capsys.readouterr().err
    assert main(["eval", "--model", start_model, "--task", "exact_match"]) == 2
    err = capsys.readouterr().err
    assert "give --eval_prompts FILE" in err and "--eval_problems 0" not in err
    assert main(["eval", "--model", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    run = tmp_path / "run"
    run.mkdir()
    (run / "trajectories.jsonl").write_text("kept\n")
    assert main(["eval", "--model", start_model, "--out", str(run)]) == 2
    assert "holds a training run" in capsys.readouterr().err and (run / "trajectories.jsonl").read_text() == "kept\n"


def test_pass_at_k_is_the_unbiased_estimator():
    """1 - C(n-c, k) / C(n, k) (Chen et al. 2021), against the binomials computed exactly."""
    from math import comb

    import pytest

    from lmpo.rollout.evaluation import pass_at_k, pass_at_ks

    for n, c, k in [(10, 3, 1), (10, 3, 5), (64, 1, 16), (64, 0, 64), (8, 8, 1), (100, 7, 64)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)
    assert pass_at_k(16, 5, 1) == pytest.approx(5 / 16)  # pass@1 is the share correct
    assert pass_at_ks(1) == [1] and pass_at_ks(16) == [1, 2, 4, 8, 16] and pass_at_ks(12) == [1, 2, 4, 8, 12]
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_sampled_eval_reports_pass_at_k_from_each_problems_samples(start_model, tmp_path, capsys):
    """--samples K: K sampled episodes per problem, reproducible from --seed, pass@k from the
    per-problem counts written to trajectories.jsonl."""
    from lmpo.rollout.evaluation import pass_at_k

    probe = tmp_path / "p.jsonl"
    probe.write_text("".join(json.dumps({"prompt": f"{n}=", "answer": "3"}) + "\n" for n in (11, 22, 33)))
    args = ["eval", "--model", start_model, "--task", f"{__file__}:FirstCharacter", "--eval_prompts", str(probe),
            "--samples", "8", "--max_new_tokens", "2", "--threads", "1", "--show", "0"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    assert main([*args, "--out", str(tmp_path / "b")]) == 0
    first, again = read_trajectories(tmp_path / "a"), read_trajectories(tmp_path / "b")
    assert len(first) == 24 and [r["segments"] for r in first] == [r["segments"] for r in again]
    assert [r["prompt"] for r in first] == [p for p in ("11=", "22=", "33=") for _ in range(8)]
    counts = [sum(r["correct"] for r in first[i:i + 8]) for i in range(0, 24, 8)]
    figures = json.loads((tmp_path / "a" / "eval.json").read_text())
    assert figures["n"] == 24 and figures["accuracy"] == sum(counts) / 24
    for k in (1, 2, 4, 8):
        assert figures["pass_at"][str(k)] == sum(pass_at_k(8, c, k) for c in counts) / 3
    assert 0 < figures["pass_at"]["1"] < figures["pass_at"]["2"] < figures["pass_at"]["8"]  # counts that differ
    assert f"pass@8 {100 * figures['pass_at']['8']:.1f}%" in capsys.readouterr().out
    assert main([*args, "--temperature", "0"]) == 2
    assert "temperature=0.0 must be > 0 with samples=8" in capsys.readouterr().err


class FirstCharacter:
    """Correct when the completion starts with a digit below 5: a random model's samples are right
    now and then, as pass@k needs."""

    name = "first_character"

    def grade(self, problem, completion, terminated):
        from lmpo.envs.base import Grade

        return Grade(correct=completion[:1] != "" and completion[0] in "01234", well_formed=True)

    def is_heldout(self, problem):
        return False


def test_eval_shows_a_long_prompts_end_and_trajectories_shows_it_whole(start_model, tmp_path, capsys, monkeypatch):
    """A chat template's system turn with tool schemas is ~800 characters in every episode; eval
    printed it whole for each episode shown, burying the question. (The test model's context is
    128 tokens, so the cap is lowered from its 300 characters to 20.)"""
    import lmpo.cli.evaluate

    monkeypatch.setattr(lmpo.cli.evaluate, "SHOWN_PROMPT_CHARS", 20)
    probe = tmp_path / "long.jsonl"
    prompt = "S" * 60 + "Q" * 14 + "31415="
    probe.write_text(json.dumps({"prompt": prompt, "answer": "x"}) + "\n")
    capsys.readouterr()
    assert main(["eval", "--model", start_model, "--max_new_tokens", "4", "--threads", "1", "--task", "exact_match",
                 "--eval_prompts", str(probe), "--out", str(tmp_path / "e"), "--show", "1"]) == 0
    printed = capsys.readouterr().out
    assert "[60 earlier characters of the prompt not shown]…" + "Q" * 14 + "31415=" in printed
    assert "SQ" not in printed
    assert main(["trajectories", str(tmp_path / "e"), "--last", "0"]) == 0
    printed = capsys.readouterr().out
    assert "S" * 60 + "Q" * 14 in printed and "not shown" not in printed
