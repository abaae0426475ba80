"""What a reward failure is called: a worker's death, the memory limit, a None under
`--reward_failure error`, a 2-D array of scores; each says what happened, as one kind."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lmpo.envs import make_task
from lmpo.rollout.reward_runner import RewardRunner

from reward_fns import allocates, fails_on_batches, kills_itself, none_and_nan, segfaults

TASK = make_task("sort_digits")
PROBLEMS = [TASK.make("12345") for _ in range(4)]


def _score(fn, completions: list[str], timeout_s: float = 5.0, policy: str = "unscorable"):
    with RewardRunner({"r": (fn, 1.0)}, timeout_s=timeout_s, policy=policy) as runner:
        return runner.score(TASK, PROBLEMS[:len(completions)], completions, [True] * len(completions))


@pytest.mark.parametrize("fn, said", [(kills_itself, "the worker process died: exit code 3 (the function ended "
                                                     "its process: os._exit, or native code)"),
                                      (segfaults, "the worker process died: killed by SIGSEGV")])
def test_a_dead_worker_is_reported_with_its_exit_status(fn, said: str):
    """It said `exit code None: EOFError()`: the status was read before the process was reaped."""
    scores = _score(fn, ["1"])
    assert scores.reasons["r"] == said


def test_the_memory_limit_is_said_once_without_a_stray_colon(tmp_path):
    """It said `(memory): memory: MemoryError over the worker's limit of 1000 MB: (see ...)`."""
    from lmpo.trainers.reward_watch import failure_kind

    with RewardRunner({"r": (allocates, 1.0)}, timeout_s=30.0) as runner:
        runner._workers["r"].memory_mb = 512
        reason = runner.score(TASK, PROBLEMS[:1], ["1"], [True]).reasons["r"]
    assert reason == "MemoryError over the worker's limit of 512 MB (raise --reward_memory_mb)"
    assert failure_kind(reason) == "memory"


@pytest.mark.parametrize("policy", ["unscorable", "error"])
def test_a_none_score_is_of_kind_value_under_either_failure_policy(policy: str, tmp_path):
    """Under `--reward_failure error` it was recorded as kind `exception`."""
    from lmpo.rollout.reward_runner import RewardFailure
    from lmpo.trainers.reward_watch import WatchedRewards

    runner = RewardRunner({"r": (none_and_nan, 1.0)}, timeout_s=0.0, policy=policy)
    with WatchedRewards(runner, tmp_path, max_unscorable_steps=0, memory_mb=512) as watched:
        try:
            watched.score(TASK, PROBLEMS[:2], ["a", "2"], [True, True])
        except RewardFailure as err:
            assert policy == "error" and err.kind == "value"
    record = json.loads((tmp_path / "reward_failures.jsonl").read_text().splitlines()[0])
    assert record["kind"] == "value" and "returned None" in record["reason"]


@pytest.mark.parametrize("scores, shape", [(lambda n: np.ones((n, 1)), "ndarray of shape \\(2, 1\\)"),
                                           (lambda n: torch.ones(n, 2), "Tensor of shape \\(2, 2\\)")])
def test_a_two_dimensional_array_of_scores_is_a_broken_contract(scores, shape: str):
    """numpy (N, 1) passed as N scores; torch (N, 2) made each completion unscorable, row by row."""
    from lmpo.rollout.reward_runner import RewardFailure

    def two_d(task, problems, completions, terminated):
        return scores(len(completions))

    with pytest.raises(RewardFailure, match=f"returned a {shape}, not a list of scores") as caught:
        _score(two_d, ["1", "2"], timeout_s=0.0)
    assert caught.value.kind == "contract"


def test_a_batch_call_that_fails_where_single_calls_score_is_said_once(tmp_path, capsys):
    """Every round paid a batch call and a call per completion, and nothing said so."""
    from lmpo.trainers.reward_watch import WatchedRewards

    runner = RewardRunner({"r": (fails_on_batches, 1.0)}, timeout_s=0.0)
    with WatchedRewards(runner, tmp_path, max_unscorable_steps=0, memory_mb=512) as watched:
        for _ in range(2):
            scores = watched.score(TASK, PROBLEMS[:3], ["1", "2", "3"], [True] * 3)
            assert scores.valid.all() and scores.retried == {"r": "RuntimeError: batch too large"}
    err = capsys.readouterr().err
    assert err.count("[reward] r failed on the batch of 3 completions (exception): RuntimeError: batch too large; "
                     "it scored them one by one instead") == 1
    records = [json.loads(line) for line in (tmp_path / "reward_failures.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["unscorable"], r["reason"]) for r in records] == [("batch", 0, "RuntimeError: batch too large")]
