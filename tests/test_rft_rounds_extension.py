"""`lmpo train rft --resume RUN --rounds N` with more rounds than the run planned. Before, it was
refused ("options differ from the interrupted run: rounds=N") where online DPO's rounds grow: a
round's prompts (a seeded stream), its samples (the checkpointed sampler) and its SFT order (seeded
by the round) never depend on the total, nor, with a constant schedule (RFT's default), its rates.
Now the run ends as one planned that long from the start, bit for bit, interrupted or finished; a
decaying schedule is refused in one line."""

from __future__ import annotations

import json

import pytest

from lmpo.cli.main import main
from tests.test_length_extension import _all_rows, _refusal
from tests.test_max_minutes_resume import _same_model

RFT = ["train", "rft", "--prompts_per_round", "4", "--samples_per_prompt", "3", "--max_new_tokens", "6",
       "--prompt_pool", "20", "--rewards", "reward_fns:count_sevens=1.0", "--reward_timeout", "0",
       "--sft_steps_per_round", "2", "--batch_size", "2", "--accept_threshold", "-inf", "--keep_top_k", "1",
       "--eval_problems", "3", "--eval_every", "3", "--lr", "1e-3", "--threads", "1"]  # evaluates rounds 3 and last


def _files(run) -> dict[str, bytes]:
    """Each round's samples and hard prompts."""
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.glob("round_*/*.jsonl"))}


def _rows(run) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time_")} for r in _all_rows(run)]


@pytest.mark.parametrize("interrupted", [False, True])
def test_an_rft_run_is_given_more_rounds_like_a_longer_run(interrupted, start_model, tmp_path, monkeypatch, capsys):
    argv = [*RFT, "--model", start_model]
    full, short = tmp_path / "full", tmp_path / "short"
    assert main([*argv, "--rounds", "4", "--out", str(full)]) == 0
    if interrupted:  # of 3 rounds, stopped by SIGTERM in round 2 (its checkpoint)
        monkeypatch.setenv("LMPO_TERM_AT", "after_rollout:2")
    rounds = "3" if interrupted else "2"
    assert main([*argv, "--rounds", rounds, "--out", str(short)]) == (143 if interrupted else 0)
    monkeypatch.delenv("LMPO_TERM_AT", raising=False)
    capsys.readouterr()
    assert main(["train", "rft", "--resume", str(short), "--rounds", "4"]) == 0
    if not interrupted:  # the last round of 2 evaluated (3 and 4 in the longer run): trained again from round 1
        assert "finished; going on to the longer --rounds from its newest checkpoint, step_000001" in \
            capsys.readouterr().out
    assert _same_model(full, short) and _rows(short) == _rows(full) and _files(short) == _files(full)
    assert [r["step"] for r in _rows(short)] == [0, 1, 2, 3, 4]
    assert json.loads((short / "result.json").read_text())["config"]["rounds"] == 4


def test_an_rft_run_with_a_decaying_schedule_refuses_more_rounds(start_model, tmp_path, capsys):
    run = tmp_path / "run"
    assert main([*RFT, "--model", start_model, "--lr_schedule", "cosine", "--rounds", "2", "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["train", "rft", "--resume", str(run), "--rounds", "4"]) == 2
    assert "rounds=4 (was 2): the cosine learning-rate schedule decays over the run's --rounds" in _refusal(capsys)
