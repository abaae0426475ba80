"""Reward functions that raise, hang, or return None/NaN make their completions unscorable:
left out of the group's baseline, zero advantage, counted; never a crash, never a silent 0."""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

from lmpo.algos import advantages_of_valid, groups_with_signal, grpo
from lmpo.envs import make_task
from lmpo.envs.reward_worker import as_scores
from lmpo.rollout.reward_runner import RewardFailure, RewardRunner
from lmpo.trainers.rl import train_rl
from lmpo.trainers.rl_config import RLConfig

from reward_fns import (exits, hangs, past_float32, a_dict, a_string, first_only, half, hangs_on_seven, kills_itself, none_and_nan, one_number,
                        raises, raises_on_seven, wrong_length)

HERE = "reward_fns"  # a light module: a worker process imports it by name


TASK = make_task("sort_digits")
PROBLEMS = [TASK.make("12345") for _ in range(4)]


def _score(fn, completions, timeout_s=5.0, policy="unscorable"):
    with RewardRunner({"r": (fn, 1.0)}, timeout_s=timeout_s, policy=policy) as runner:
        return runner.score(TASK, PROBLEMS[:len(completions)], completions, [True] * len(completions))


@pytest.mark.parametrize("timeout_s", [5.0, 0.0], ids=["worker", "in-process"])
def test_a_raising_reward_makes_every_completion_unscorable(timeout_s):
    scores = _score(raises, ["1", "2"], timeout_s)
    assert scores.valid.tolist() == [False, False]
    assert scores.failures == {"r": 2} and "the grader crashed" in scores.reasons["r"]
    assert scores.components["r"].tolist() == [0.0, 0.0]


def test_a_failing_batch_is_retried_completion_by_completion():
    scores = _score(raises_on_seven, ["12", "17", "33"])
    assert scores.valid.tolist() == [True, False, True]
    assert scores.components["r"].tolist() == [1.0, 0.0, 1.0]


def test_none_and_nan_are_unscorable():
    scores = _score(none_and_nan, ["a", "b", "c"])
    assert scores.valid.tolist() == [False, False, True]
    assert scores.components["r"].tolist() == [0.0, 0.0, 2.0]


def test_a_hanging_reward_is_killed_from_outside_at_its_timeout():
    start = time.perf_counter()
    with RewardRunner({"r": (hangs_on_seven, 1.0)}, timeout_s=1.0) as runner:
        worker = runner._workers["r"]
        scores = runner.score(TASK, PROBLEMS[:3], ["12", "17", "333"], [True] * 3)
        # the batch call and the lone "17" call overran; each time the worker was killed
        assert scores.valid.tolist() == [True, False, True]
        assert scores.components["r"].tolist() == [2.0, 0.0, 3.0]
        assert "no answer within 1 s" in scores.reasons["r"]
        pid = worker.process.pid
    assert time.perf_counter() - start < 30
    assert not os.path.exists(f"/proc/{pid}") or _is_zombie_or_gone(pid)


def test_a_worker_that_dies_is_replaced():
    with RewardRunner({"r": (kills_itself, 1.0), "ok": (half, 1.0)}, timeout_s=5.0, trusted=["ok"]) as runner:
        for _ in range(2):
            scores = runner.score(TASK, PROBLEMS[:2], ["1", "2"], [True, True])
            assert scores.valid.tolist() == [False, False]
            assert "died" in scores.reasons["r"]


@pytest.mark.parametrize("timeout_s", [5.0, 0.0], ids=["worker", "in-process"])
@pytest.mark.parametrize("fn", [wrong_length, first_only])
def test_a_reward_returning_the_wrong_number_of_scores_stops_under_either_policy(fn, timeout_s):
    # not retried completion by completion: `first_only` would then seem to work, 64 calls a batch
    for policy in ("unscorable", "error"):
        with pytest.raises(RewardFailure, match=r"'r' returned \d scores? for 2 completions; a reward function "
                                                r"returns one score per completion") as err:
            _score(fn, ["1", "22"], timeout_s, policy)
        assert (err.value.function, err.value.unscorable, err.value.kind) == ("r", 2, "contract")


def test_error_policy_names_the_prompt_and_the_function():
    with pytest.raises(RewardFailure, match=r"'r'.*'17'.*'12345='"):
        _score(raises_on_seven, ["12", "17"], policy="error")


def test_unscorable_completions_are_left_out_of_the_baseline():
    rewards = torch.tensor([1.0, 0.0, 0.0, 5.0, 1.0, 1.0])
    group_ids = torch.tensor([0, 0, 0, 0, 1, 1])
    valid = torch.tensor([True, True, True, False, True, False])
    adv = advantages_of_valid(grpo, rewards, group_ids, valid)
    expected = grpo(rewards[:3], group_ids[:3])  # the group as if the unscorable one was never sampled
    assert torch.equal(adv[:3], expected)
    assert adv[3] == 0 and adv[4] == 0 and adv[5] == 0  # group 1 has one scorable member: no signal
    signal = groups_with_signal(rewards, group_ids, valid)
    assert signal.tolist() == [True, True, True, True, False, False]


def _is_zombie_or_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_rl_counts_unscorable_completions_and_keeps_training(start_model, tmp_path):
    cfg = RLConfig(model=str(start_model), out=str(tmp_path / "rl"), steps=3, prompts_per_step=2, group_size=4,
                   max_new_tokens=6, eval_problems=0, save_every=0, threads=1,
                   rewards=f"correct=1.0,{HERE}:half=0.5", reward_timeout=10.0)
    result = train_rl(cfg)
    rows = [json.loads(line) for line in open(tmp_path / "rl" / "metrics.jsonl")]
    steps = [r for r in rows if "reward_mean" in r]
    assert len(steps) == 3 and result.model_dir
    for row in steps:
        assert row["unscorable"] == 4 and row[f"unscorable_{HERE}:half"] == 4
        assert math.isfinite(row["reward_mean"])


def test_rl_error_policy_stops_with_the_prompt_and_function(start_model, tmp_path):
    cfg = RLConfig(model=str(start_model), out=str(tmp_path / "rl"), steps=2, prompts_per_step=2, group_size=2,
                   max_new_tokens=4, eval_problems=0, save_every=0, threads=1,
                   rewards=f"{HERE}:raises=1.0", reward_timeout=0.0, reward_failure="error")
    with pytest.raises(RewardFailure, match=rf"{HERE}:raises.*prompt"):
        train_rl(cfg)


def test_a_killed_trainer_leaves_no_reward_worker_behind(start_model, tmp_path):
    """SIGKILL the trainer while its reward worker is stuck in a call: the worker dies with it
    (it asked the kernel for SIGKILL when its parent dies), rather than hanging on forever."""
    import subprocess
    import sys
    import uuid

    marker = uuid.uuid4().hex
    in_call = tmp_path / "in_call"
    env = {**os.environ, "LMPO_TEST_MARKER": marker, "LMPO_TEST_IN_CALL": str(in_call),
           "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "lmpo", "train", "grpo", "--model", start_model,
                             "--out", str(tmp_path / "rl"), "--steps", "2", "--prompts_per_step", "2",
                             "--group_size", "2", "--max_new_tokens", "4", "--eval_problems", "0", "--threads", "1",
                             "--rewards", "correct=1.0,reward_fns:hangs=0.5", "--reward_timeout", "600"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while not in_call.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)  # until the worker is inside its hanging call (it says so), not a guessed delay
        workers = [p for p in _processes_with(marker) if p != proc.pid]
        assert in_call.exists() and workers, "the reward worker never entered its call"
        assert int(in_call.read_text()) in workers
    finally:
        proc.kill()
        proc.wait()
    deadline = time.time() + 10
    while _processes_with(marker) and time.time() < deadline:
        time.sleep(0.1)
    assert _processes_with(marker) == []


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if marker.encode() in f.read() and not _is_zombie_or_gone(int(entry)):
                        found.append(int(entry))
            except OSError:
                continue
    return found


def test_a_reward_model_that_is_not_one_is_refused_rather_than_scoring_noise(start_model, tmp_path, capsys):
    """A causal LM given as --reward_model loaded as a sequence classifier with a freshly
    initialised head, its warning silenced: rewards were noise and the run went on. Now the
    config's architecture is checked before training, and a checkpoint without the head's
    weights (a config that names no architecture) stops the run in one line when it loads."""
    import shutil

    from lmpo.cli.main import main

    argv = ["train", "grpo", "--model", start_model, "--rewards", "rm=1.0", "--steps", "1", "--prompts_per_step", "2",
            "--group_size", "2", "--max_new_tokens", "4", "--eval_problems", "0", "--threads", "1", "--save_every", "0"]
    assert main([*argv, "--reward_model", start_model, "--out", str(tmp_path / "a")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"lmpo: error: reward_model {start_model!r} is a LlamaForCausalLM, not a reward model: loaded as one it would "
        "score with an untrained head, so its rewards would be noise; give a directory written by `lmpo train rm` (or "
        "any ...ForSequenceClassification model with one label)")
    unnamed = tmp_path / "unnamed"
    shutil.copytree(start_model, unnamed)
    config = json.loads((unnamed / "config.json").read_text())
    del config["architectures"]
    (unnamed / "config.json").write_text(json.dumps(config))
    assert main([*argv, "--reward_model", str(unnamed), "--out", str(tmp_path / "b")]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"lmpo: error: the worker for reward function rm ({unnamed}) could not start: ValueError: reward model "
        f"{unnamed}: its checkpoint has no score.weight: loaded as a reward model it would score with an untrained "
        "head; give a directory written by `lmpo train rm`")


@pytest.mark.parametrize("timeout_s", [5.0, 0.0], ids=["worker", "in-process"])
@pytest.mark.parametrize("fn, returned", [(one_number, r"returned 1\.0 \(float\), not a list of scores"),
                                          (a_dict, r"returned \{'score': 1\.0\} \(dict\), not a list of scores"),
                                          (a_string, r"returned '11' \(str\), not a list of scores")])
def test_a_reward_returning_no_list_of_scores_stops_the_run(fn, returned, timeout_s):
    with pytest.raises(RewardFailure, match=rf"'r' {returned}; a reward function returns one score per") as err:
        _score(fn, ["1", "2"], timeout_s)
    assert err.value.kind == "contract"


def test_arrays_tensors_and_generators_of_scores_are_lists_of_scores():
    import numpy as np

    for values in (np.array([1.0, 2.0]), torch.tensor([1.0, 2.0]), (v for v in [1.0, 2.0])):
        assert list(as_scores(values)) == [1.0, 2.0]


def test_a_wrong_count_is_recorded_as_its_own_kind(tmp_path):
    from lmpo.trainers.reward_watch import FAILURES_FILE, WatchedRewards

    runner = RewardRunner({"r": (first_only, 1.0)}, timeout_s=0.0)
    with pytest.raises(RewardFailure):
        WatchedRewards(runner, tmp_path, 3, 1024).score(TASK, PROBLEMS[:3], ["1", "2", "3"], [True] * 3)
    (entry,) = [json.loads(line) for line in (tmp_path / FAILURES_FILE).read_text().splitlines()]
    assert (entry["kind"], entry["unscorable"], entry["of"]) == ("contract", 3, 3)


def test_correct_judges_what_evaluation_judges_on_a_task_that_grades_whole_episodes(start_model, tmp_path):
    """A task with `grade_trajectory` (its environment's verdict on the episode): accuracy read it,
    and `correct` read `grade` on the final text, so reward 0 stood beside accuracy 1."""
    task_file = tmp_path / "episode_task.py"
    task_file.write_text(
        "from lmpo.envs.base import Grade\n"
        "from lmpo.envs.sort_digits import SortDigits\n\n"
        "class Judged(SortDigits):\n"
        "    def grade_trajectory(self, trajectory):\n"
        "        return Grade(correct=True, well_formed=False)\n")
    out = tmp_path / "rl"
    train_rl(RLConfig(model=start_model, out=str(out), task=f"{task_file}:Judged", steps=1, prompts_per_step=2,
                      group_size=2, eval_problems=0, save_every=0, threads=1, rewards="correct=1.0,format=0.5"))
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["accuracy"] == 1.0 and row["reward_correct"] == 1.0
    assert row["reward_format"] == 0.0  # format judges the final answer's text, as `task.grade` does


@pytest.mark.parametrize("timeout_s", [5.0, 0.0], ids=["worker", "in-process"])
def test_a_reward_that_exits_is_unscorable_and_does_not_end_the_run(timeout_s):
    """In this process, SystemExit(0) ended the trainer with exit code 0 and nothing written."""
    scores = _score(exits, ["1", "2"], timeout_s)
    assert scores.valid.tolist() == [False, False] and "SystemExit" in scores.reasons["r"]


def test_a_score_past_the_float32_range_is_unscorable_not_inf():
    """1e39 passed the finiteness check, then became inf in the float32 rewards (reward_std nan)."""
    scores = _score(past_float32, ["12", "17"], 0.0)
    assert scores.valid.tolist() == [True, False] and torch.isfinite(scores.components["r"]).all()
    assert "past the float32 range" in scores.reasons["r"]
    from lmpo.envs.reward_worker import as_scores

    assert as_scores([10 ** 400, 1]) == [None, 1.0]  # an int past even float64's range


def test_after_a_timed_out_batch_the_lone_calls_share_one_more_timeout(monkeypatch):
    """A reward that hangs on every completion cost (n + 1) timeouts a step: 65 minutes at the
    defaults (64 completions, 60 s)."""
    from lmpo.rollout import reward_runner

    given = []
    real = reward_runner._Worker.call

    def recording(self, args, timeout_s):
        given.append(timeout_s)
        return real(self, args, timeout_s)

    monkeypatch.setattr(reward_runner._Worker, "call", recording)
    scores = _score(hangs, ["1", "2", "3", "4"], timeout_s=1.0)
    assert scores.valid.tolist() == [False] * 4 and "no answer within" in scores.reasons["r"]
    assert given == [1.0, 0.25, 0.25, 0.25, 0.25]  # was [1.0, 1.0, 1.0, 1.0, 1.0]
    given.clear()
    scores = _score(raises, ["1", "2"], timeout_s=1.0)  # a batch that raised: each lone call its own timeout
    assert given == [1.0, 1.0, 1.0] and not scores.valid.any()


def test_reward_weights_must_be_finite_and_given_once():
    from lmpo.envs import parse_reward_weights

    for spec in ("correct=nan", "correct=inf", "correct=-inf"):
        with pytest.raises(ValueError, match="must be a finite number"):
            parse_reward_weights(spec)
    with pytest.raises(ValueError, match="reward 'correct' is given twice"):
        parse_reward_weights("correct=1,correct=2")


def test_a_reward_function_given_as_a_file_scores_in_its_worker(tmp_path, start_model):
    """`--task` took path/to/file.py:Class and `--rewards` did not: 'No module named '/tmp/my''."""
    from lmpo.envs import parse_reward_weights, reward_functions

    path = tmp_path / "my rewards.py"  # a space in the path, too
    path.write_text("def digits(task, problems, completions, terminated):\n"
                    "    return [float(sum(ch.isdigit() for ch in c)) for c in completions]\n")
    spec = f"correct=1.0,{path}:digits=0.5"
    fns = reward_functions(parse_reward_weights(spec))
    with RewardRunner({name: (fn, 1.0) for name, fn in fns.items()}, timeout_s=5.0, trusted=["correct"]) as runner:
        scores = runner.score(TASK, PROBLEMS[:2], ["12a", "x"], [True, True])
    assert scores.components[f"{path}:digits"].tolist() == [2.0, 0.0] and scores.valid.all()
    with pytest.raises(ValueError, match="has no function 'nothing'"):
        reward_functions(parse_reward_weights(f"{path}:nothing=1"))
    with pytest.raises(ValueError, match="does not exist"):
        reward_functions(parse_reward_weights(f"{tmp_path}/absent.py:digits=1"))


@pytest.mark.parametrize("labels, named", [(None, "(config.json names none: transformers' default)"),
                                           ({0: "bad", 1: "neutral", 2: "good"}, "(bad, neutral, good)")])
def test_a_classifier_with_several_labels_is_refused_as_a_reward_model(start_model, tmp_path, capsys, labels, named):
    """QA: a two-label sequence classifier given as --reward_model was accepted, its reward label
    0's logit in silence. Now its labels are checked before training, as the error for another
    kind of model promised ("any ...ForSequenceClassification model with one label"); one whose
    config names no architecture is refused when its worker loads it, and the scorer itself
    refuses a head of several labels."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from lmpo.cli.main import main
    from lmpo.models.reward_scorer import last_token_scores

    count = len(labels) if labels else 2
    extra = {"id2label": labels} if labels else {}
    model = AutoModelForSequenceClassification.from_pretrained(start_model, num_labels=count, **extra)
    model.save_pretrained(tmp_path / "cls")
    shutil.copy(Path(start_model) / "tokenizer.json", tmp_path / "cls")
    shutil.copy(Path(start_model) / "tokenizer_config.json", tmp_path / "cls")
    argv = ["train", "grpo", "--model", start_model, "--rewards", "rm=1.0", "--steps", "1", "--prompts_per_step", "2",
            "--group_size", "2", "--max_new_tokens", "4", "--eval_problems", "0", "--threads", "1", "--save_every", "0"]
    assert main([*argv, "--reward_model", str(tmp_path / "cls"), "--out", str(tmp_path / "a")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"lmpo: error: reward_model {str(tmp_path / 'cls')!r} is a LlamaForSequenceClassification with {count} labels "
        f"{named}, not a reward model: a reward is one score, and read as one its reward would be the first label's "
        "logit alone; give a directory written by `lmpo train rm` (or any ...ForSequenceClassification model with "
        "one label)")
    assert not (tmp_path / "a").exists()
    config = json.loads((tmp_path / "cls" / "config.json").read_text())
    del config["architectures"]
    (tmp_path / "cls" / "config.json").write_text(json.dumps(config))
    if labels:  # its labels named: refused before training all the same
        assert main([*argv, "--reward_model", str(tmp_path / "cls"), "--out", str(tmp_path / "b")]) == 2
        assert "is a sequence classifier with 3 labels (bad, neutral, good)" in capsys.readouterr().err
    else:  # nothing says what it is: refused when the worker loads it, with transformers' two labels
        assert main([*argv, "--reward_model", str(tmp_path / "cls"), "--out", str(tmp_path / "b")]) == 1
        assert capsys.readouterr().err.strip().splitlines()[-1] == (
            f"lmpo: error: the worker for reward function rm ({tmp_path / 'cls'}) could not start: ValueError: reward "
            f"model {tmp_path / 'cls'}: a classifier with 2 labels (LABEL_0, LABEL_1), not one score; give a directory "
            "written by `lmpo train rm` (or any ...ForSequenceClassification model with one label)")
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match=f"has {count} labels, not one"):
        last_token_scores(model, ids, torch.ones_like(ids))


def test_a_task_that_cannot_be_pickled_is_named_with_its_attribute():
    """Before: a task holding a sqlite3 connection, with a reward function of the user's, ended the
    run with pickle's traceback from inside the reward runner (`TypeError: cannot pickle
    'sqlite3.Connection' object`); now one error names the task, the attribute and what to do."""
    import sqlite3

    task = make_task("sort_digits")
    task.db = sqlite3.connect(":memory:")
    with RewardRunner({"r": (half, 1.0)}, timeout_s=5.0) as runner:
        with pytest.raises(RewardFailure) as info:
            runner.score(task, PROBLEMS[:2], ["12", "21"], [True, True])
    said = str(info.value)
    assert said.startswith("reward function 'r': the task SortDigits cannot be pickled (its attribute 'db', a "
                           "sqlite3.Connection): TypeError: cannot pickle 'sqlite3.Connection' object;"), said
    assert "make_env()" in said and "--reward_timeout 0" in said and info.value.unscorable == 2
