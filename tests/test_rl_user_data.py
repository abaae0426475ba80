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


def test_exact_match_grades_a_reasoning_models_answer_after_its_thinking():
    """A reasoning model (Qwen3, DeepSeek-R1) writes `<think>...</think>` before its answer: graded
    whole, every completion was wrong, every reward 0."""
    task, p = make_task("exact_match:answer_after=</think>"), Problem("6*7=", "42")
    assert task.grade(p, "<think>6*7 is 42</think>\n42", True).correct
    assert not make_task("exact_match").grade(p, "<think>6*7 is 42</think>\n42", True).correct
    unfinished = task.grade(p, "<think>6*7 is 42, so 42", True)  # no answer after the thinking
    assert not unfinished.correct and not unfinished.well_formed
    assert not task.grade(p, "<think>x</think>42", False).correct  # cut off by the token budget


def test_exact_match_grades_against_the_answer_after_a_marker_in_the_reference():
    """GSM8K's answers are a worked solution ending `#### 42`."""
    task = make_task("exact_match:answer_after=####,reference_after=####")
    p = Problem("Janet has 6 apples and eats 2 ...", "She has 6 - 2 = <<6-2=4>>4 left.\n#### 4")
    assert task.grade(p, "6 - 2 = 4\n#### 4", True).correct
    assert not task.grade(p, "6 - 2 = 4\n#### 5", True).correct
    assert not make_task("exact_match:answer_after=####").grade(p, "6 - 2 = 4\n#### 4", True).correct
    assert make_task("exact_match:reference_after=####").grade(Problem("q", "4"), "4", True).correct  # no marker: whole


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


@pytest.mark.parametrize("trainer", ["rl", "online_dpo", "rft", "sft", "dpo", "kto", "rm"])
def test_a_run_says_what_is_wrong_with_its_prompts_or_data_before_the_model_loads(start_model, tmp_path, trainer,
                                                                                  monkeypatch):
    """A user's file task without `--eval_prompts` (or an embedded-only trainer given exact_match),
    or a bad row in a data file, used to fail only once the policy (and reference) had loaded:
    minutes for a large model."""
    from lmpo.trainers import harness, reward_model
    from lmpo.trainers.kto import KTOConfig, train_kto
    from lmpo.trainers.online_dpo import OnlineDPOConfig, train_online_dpo
    from lmpo.trainers.preference import PreferenceConfig, train_preference
    from lmpo.trainers.reward_model import RewardModelConfig, train_reward_model
    from lmpo.trainers.rft import RFTConfig, train_rft
    from lmpo.trainers.supervised import SFTConfig, train_sft

    def no_load(*args, **kwargs):
        raise AssertionError("the model loaded before the run's prompts or data were checked")

    monkeypatch.setattr(harness.Run, "load_policy", no_load)
    monkeypatch.setattr(reward_model, "load_reward_model", no_load)
    prompts = _write(tmp_path / "p.jsonl", [{"prompt": "1=", "answer": "1"}])
    data = _write(tmp_path / "d.jsonl", [{"prompt": "1=", "completion": "1"}])
    pairs = _write(tmp_path / "pairs.jsonl", [{"prompt": "1=", "chosen": "1", "rejected": "2"}, {"prompt": "2="}])
    unpaired = _write(tmp_path / "u.jsonl", [{"prompt": "1=", "completion": "1", "label": True}, {"prompt": "2="}])
    common = {"model": str(start_model), "out": str(tmp_path / trainer), "task": "exact_match", "threads": 1}
    run, cfg, missing = {
        "rl": (train_rl, RLConfig(**common, prompts=str(prompts), reward_timeout=0), "held-out prompts"),
        "online_dpo": (train_online_dpo, OnlineDPOConfig(**common, reward_timeout=0), "--prompts"),
        "rft": (train_rft, RFTConfig(**common, reward_timeout=0), "--prompts"),
        "sft": (train_sft, SFTConfig(**common, data=str(data), eval_prompts=str(tmp_path / "none.jsonl")),
                "none.jsonl"),
        "dpo": (train_preference, PreferenceConfig(**common, data=str(pairs)), "pairs.jsonl: row 2: field 'chosen'"),
        "kto": (train_kto, KTOConfig(**common, data=str(unpaired)), "u.jsonl: row 2"),
        "rm": (train_reward_model, RewardModelConfig(**common, data=str(pairs)), "pairs.jsonl: row 2: field 'chosen'"),
    }[trainer]
    with pytest.raises(Exception, match=missing):
        run(cfg)


@pytest.mark.parametrize("trainer", ["online_dpo", "rft"])
def test_online_dpo_and_rft_train_and_evaluate_on_a_users_prompt_files(start_model, tmp_path, trainer, capsys,
                                                                       monkeypatch):
    import importlib

    from lmpo.trainers.online_dpo import OnlineDPOConfig, train_online_dpo
    from lmpo.trainers.rft import RFTConfig, train_rft

    import lmpo.envs.data.prompts as prompt_files

    module = importlib.import_module(f"lmpo.trainers.{trainer}")
    evaluated, evaluate = [], module.evaluate
    reads, read_records = [], prompt_files.read_records
    monkeypatch.setattr(prompt_files, "read_records", lambda path, *a, **kw: (reads.append(str(path)),
                                                                              read_records(path, *a, **kw))[1])
    monkeypatch.setattr(module, "evaluate", lambda model, tok, task, problems, **kw: (
        evaluated.append([p.prompt for p in problems]), evaluate(model, tok, task, problems, **kw))[1])
    rows = [{"prompt": f"{d}=", "answer": "".join(sorted(d))} for d in ("31415", "27182", "16180", "14142")]
    train = _write(tmp_path / "train.jsonl", rows)
    heldout = _write(tmp_path / "heldout.jsonl", [{"prompt": "55123=", "answer": "12355"},
                                                  {"prompt": "90210=", "answer": "00129"}])
    common = {"model": str(start_model), "out": str(tmp_path / trainer), "task": "exact_match", "prompts": str(train),
              "eval_prompts": str(heldout), "eval_problems": 5, "rounds": 2, "prompts_per_round": 2,
              "max_new_tokens": 6, "threads": 1, "reward_timeout": 0, "save_every": 0}
    if trainer == "online_dpo":
        result = train_online_dpo(OnlineDPOConfig(**common, samples_per_prompt=3, batch_size=2, eval_every=1))
    else:
        result = train_rft(RFTConfig(**common, samples_per_prompt=3, sft_steps_per_round=1, batch_size=2,
                                     accept_threshold=float("-inf")))
    assert f"4 training prompts from {train}" in capsys.readouterr().out and result.accuracy is not None
    assert evaluated and all(p == ["55123=", "90210="] for p in evaluated)  # the file's rows, all of them
    assert sorted(reads) == sorted([str(train), str(heldout)])  # each file read once, checked and used
    if trainer == "rft":  # what each round sampled
        sampled = tmp_path / trainer / "round_1" / "samples.jsonl"
        assert {json.loads(line)["prompt"] for line in open(sampled)} <= {r["prompt"] for r in rows}


def test_prompt_and_answer_columns_of_other_names(start_model, tmp_path, capsys):
    """GSM8K's files say `question`; without --prompt_field the error says how to name it."""
    from lmpo.cli.main import main

    rows = [{"question": f"{d}=", "solution": "".join(sorted(d))} for d in ("31415", "27182")]
    path = _write(tmp_path / "gsm.jsonl", rows)
    args = ["train", "grpo", "--model", str(start_model), "--task", "exact_match", "--prompts", str(path),
            "--eval_prompts", str(path), "--steps", "1", "--prompts_per_step", "2", "--group_size", "2",
            "--max_new_tokens", "6", "--threads", "1", "--save_every", "0", "--reward_timeout", "0"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "field 'prompt'" in err and "(--prompt_field question reads the row's 'question' column)" in err
    assert main([*args, "--out", str(tmp_path / "b"), "--prompt_field", "question"]) == 2
    assert "(task exact_match; --answer_field solution reads the row's 'solution' column)" in capsys.readouterr().err
    assert main([*args, "--out", str(tmp_path / "c"), "--prompt_field", "question", "--answer_field", "solution"]) in (0, None)
    odd = _write(tmp_path / "odd.jsonl", [{"q_text": "31415=", "gold": "11345"}])  # nothing to suggest
    assert main([*args, "--out", str(tmp_path / "d"), "--prompts", str(odd)]) == 2
    assert "(prompt_field, --prompt_field on the command line, names another column)" in capsys.readouterr().err
    kept = [json.loads(line) for line in open(tmp_path / "c" / "trajectories.jsonl")]
    assert {(t["prompt"], t["answer"]) for t in kept} <= {("31415=", "11345"), ("27182=", "12278")}


def test_held_out_prompts_that_are_also_training_prompts_are_reported(start_model, tmp_path, capsys):
    """A split made twice (or not at all) gave a held-out accuracy over problems the run trained
    on, without a word. Only the rows evaluated (the first eval_problems) count."""
    from lmpo.trainers.preflight import load_prompt_files

    rows = [{"prompt": f"{d}=", "answer": "".join(sorted(d))} for d in ("31415", "27182", "16180", "14142")]
    train = _write(tmp_path / "train.jsonl", rows)
    heldout = _write(tmp_path / "heldout.jsonl", [{"prompt": "55123=", "answer": "12355"}, rows[2],
                                                  {"prompt": "90210=", "answer": "00129"}, rows[0]])
    cfg = RLConfig(model=str(start_model), task="exact_match", prompts=str(train), eval_prompts=str(heldout),
                   eval_problems=3)
    load_prompt_files(cfg)
    assert (f"[rl] warning: 1 of the 3 held-out prompts (33%) of {heldout} are also training prompts in {train} "
            f"(e.g. '16180='): held-out accuracy on them measures what training saw") in capsys.readouterr().out
    load_prompt_files(RLConfig(**{**cfg.__dict__, "eval_problems": 1}))
    assert "warning" not in capsys.readouterr().out


def test_a_pipeline_checks_every_stages_inputs_before_cpt(tmp_path, capsys, monkeypatch):
    """A user's `lmpo pipeline --task exact_match` stopped on a traceback (`'ExactMatch' object
    has no attribute 'cpt_corpus'`) after writing its run directory; with the files given, a bad
    row in --rl_stage.prompts, a missing held-out set or one too small for the stopping rule
    stopped it only after CPT and SFT had trained for minutes."""
    import lmpo.rollout.engine_select as engine_select
    from lmpo.cli.main import main

    monkeypatch.setattr(engine_select, "vllm_availability", lambda: engine_select.VLLMAvailability(False, False))
    docs = _write(tmp_path / "docs.jsonl", [{"text": f"{i:05d}= {''.join(sorted(f'{i:05d}'))}"} for i in range(50)])
    demos = _write(tmp_path / "demos.jsonl", [{"prompt": f"{i:05d}=", "answer": "".join(sorted(f"{i:05d}"))}
                                             for i in range(50)])
    held = _write(tmp_path / "held.jsonl", [{"prompt": f"{i:05d}=", "answer": "".join(sorted(f"{i:05d}"))}
                                            for i in range(900, 910)])
    bad = _write(tmp_path / "bad.jsonl", [{"prompt": "12=", "answer": "12"}, {"prompt": "", "answer": "1"}])
    files = ["--cpt.data", str(docs), "--sft.data", str(demos)]
    cases = [([], "task 'exact_match' has no CPT corpus of its own (no cpt_corpus method): give a file with "
                  "--cpt.data"),
             (["--cpt.data", str(docs)], "has no SFT demonstrations of its own (no sft_demonstrations method): give "
                                         "a file with --sft.data"),
             ([*files, "--rl_stage.prompts", str(bad)], f"{bad}: row 2: field 'prompt'"),
             ([*files, "--rl", "rft", "--rft.prompts", str(bad)], f"{bad}: row 2: field 'prompt'"),
             (files, "task exact_match has no embedded prompts: give a prompt file (--prompts FILE) (in a pipeline, "
                     "the option is --rl_stage.<name>)"),
             ([*files, "--rl_stage.prompts", str(demos)], "has no embedded held-out prompts"),
             ([*files, "--rl_stage.prompts", str(demos), "--rl_stage.eval_prompts", str(held)],
              "held.jsonl: 10 rows, all of them reported (eval_problems=500); the stopping rule needs"),
             ([*files, "--rl_stage.prompts", str(demos), "--rl_stage.engine", "vllm"], "engine=vllm: ")]
    for i, (extra, message) in enumerate(cases):
        out = tmp_path / f"run{i}"
        assert main(["pipeline", "--task", "exact_match", *extra, "--out", str(out)]) == 2, message
        assert message in capsys.readouterr().err
        assert not out.exists(), message
    for stage, what in (("cpt", "CPT corpus"), ("sft", "SFT demonstrations")):
        out = tmp_path / stage
        assert main(["train", stage, "--task", "exact_match", "--model", "tiny", "--out", str(out)]) == 2
        assert f"has no {what} of its own" in capsys.readouterr().err and not out.exists()


def test_a_run_on_its_own_prompts_says_when_it_evaluates_on_the_tasks_held_out_problems(capsys):
    """`lmpo train grpo --prompts mine.jsonl` (no --task, no --eval_prompts) reported the default
    task's held-out accuracy (sort_digits, on chat arithmetic prompts) without a word."""
    from lmpo.trainers.prompts import heldout_prompts

    task = make_task("sort_digits")
    mine = [Problem("What is 2 plus 3?", "5")]
    assert heldout_prompts(task, {"prompts": mine}, "", 3, "rl") == task.heldout_problems(3)
    assert "[rl] held-out: 3 problems of the task's own held-out split (sort_digits" in capsys.readouterr().out
    heldout_prompts(task, {}, "", 3, "rl")  # the task's own prompts: its own held-out split, nothing to say
    assert heldout_prompts(task, {"prompts": mine, "eval_prompts": mine}, "held.jsonl", 3, "rl") == mine
    assert capsys.readouterr().out == ""
