"""Rejection-sampling fine-tuning: sample, keep what the verifier accepts, SFT on it, repeat."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lmpo.trainers.rft import RFTConfig, accepted_samples, train_rft
from lmpo.trainers.validation import ConfigError

# the verifier of these runs: a completion is accepted when it holds a 7 (a random model writes some)
VERIFIER = "reward_fns:count_sevens=1.0"


def test_accepted_samples_by_threshold_distinct_and_top_k():
    nan = float("nan")
    scores = torch.tensor([1.0, 0.0, 1.0, 3.0, nan, 0.5, 2.0, 2.0])
    completions = [[1], [2], [1], [3], [4], [5], [6], [7]]
    assert accepted_samples(scores, completions, 4, 1.0, distinct=False) == [0, 2, 3, 6, 7]
    assert accepted_samples(scores, completions, 4, 1.0) == [0, 3, 6, 7]  # sample 2 repeats sample 0
    assert accepted_samples(scores, completions, 4, 1.0, top_k=1) == [3, 6]  # the best; a tie: the earlier
    assert accepted_samples(scores, completions, 4, float("-inf"), top_k=2, distinct=False) == [0, 3, 6, 7]
    assert accepted_samples(torch.full((4,), nan), completions[:4], 4, float("-inf")) == []  # unscorable: never


def test_a_cut_off_sample_is_not_counted_as_accepted():
    """RAFT's recipe (-inf, the best of each prompt) accepts every scorable sample that ended: a
    sample cut off at the token limit is never kept, so it is not accepted either."""
    from types import SimpleNamespace

    from lmpo.trainers.rft import RoundSamples, round_figures

    ended = [True, False, False, True, False, False, False, False]
    samples = RoundSamples(problems=[object(), object()], trajectories=[SimpleNamespace(terminated=e) for e in ended],
                           scores=torch.ones(8), kept=[0, 3])
    figures = round_figures(samples, RFTConfig(accept_threshold=float("-inf"), keep_top_k=1), retried=0, hard=0)
    assert figures["acceptance_rate"] == 2 / 8 and figures["cut_off_rate"] == 6 / 8 and figures["kept"] == 2
    figures = round_figures(samples, RFTConfig(accept_threshold=2.0), retried=0, hard=2)
    assert figures["acceptance_rate"] == 0.0 and figures["solved_rate"] == 0.0


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _config(start_model: str, out: Path, **options) -> RFTConfig:
    options = {"rounds": 3, "prompts_per_round": 6, "samples_per_prompt": 4, "prompt_pool": 40, "max_new_tokens": 6,
               "rewards": VERIFIER, "reward_timeout": 0, "sft_steps_per_round": 2, "batch_size": 4, "lr": 1e-3,
               "eval_problems": 8, "threads": 1, **options}
    return RFTConfig(model=start_model, out=str(out), **options)


def test_rounds_keep_exactly_the_accepted_samples_and_retry_the_hard_prompts(start_model, tmp_path):
    out = tmp_path / "rft"
    result = train_rft(_config(start_model, out, max_new_tokens=48))  # room for the random model to end some
    rows = [r for r in _rows(out) if "kept" in r]
    assert [r["step"] for r in rows] == [1, 2, 3] and result.accuracy is not None
    assert sum(r["kept"] for r in rows) > 0 and rows[-1]["updates"] > 0
    previous_hard: list[str] = []
    cut_off_with_a_7 = 0
    for row in rows:
        samples = _jsonl(out / f"round_{row['step']}" / "samples.jsonl")
        assert len(samples) == 6 * 4
        for start in range(0, 24, 4):  # per prompt: the first of each distinct completion with a 7
            group, seen = samples[start:start + 4], set()
            for s in group:  # a cut-off sample is never kept, whatever its reward
                accepted = "7" in s["completion"] and s["ended"] and s["completion"] not in seen
                seen.add(s["completion"]) if "7" in s["completion"] and s["ended"] else None
                assert s["kept"] == accepted and s["reward"] == s["completion"].count("7")
        prompts = [samples[i]["prompt"] for i in range(0, 24, 4)]
        hard = _jsonl(out / f"round_{row['step']}" / "hard_prompts.jsonl")
        assert [h["prompt"] for h in hard] == [p for j, p in enumerate(prompts)
                                               if not any(s["kept"] for s in samples[4 * j:4 * j + 4])]
        assert all(h["samples"] == 4 for h in hard)
        for j, prompt in enumerate(prompts):  # a hard prompt's samples: no 7, or cut off
            if prompt in [h["prompt"] for h in hard]:
                assert not any("7" in s["completion"] and s["ended"] for s in samples[4 * j:4 * j + 4])
        assert row["kept"] == sum(s["kept"] for s in samples) and row["hard_prompts"] == len(hard)
        # accepted: what RFT may keep, a 7 in a sample that ended (repeats count, as before `distinct`)
        assert row["acceptance_rate"] == sum("7" in s["completion"] and s["ended"] for s in samples) / 24
        assert row["cut_off_rate"] == sum(not s["ended"] for s in samples) / 24
        assert prompts[:len(previous_hard[:3])] == previous_hard[:3]  # retry_hard 0.5: up to 3 of 6 retried
        previous_hard = [h["prompt"] for h in hard]
        cut_off_with_a_7 += sum("7" in s["completion"] and not s["ended"] for s in samples)
    assert cut_off_with_a_7 > 0  # the rule that keeps no cut-off sample was met


def test_a_resumed_run_ends_with_the_uninterrupted_runs_model(start_model, tmp_path):
    full = tmp_path / "full"
    cfg = _config(start_model, full, eval_problems=0)
    train_rft(cfg)
    resumed = tmp_path / "resumed"  # the run as if killed during round 2: only round 1's checkpoint is complete
    shutil.copytree(full, resumed, ignore=shutil.ignore_patterns("model", "result.json", "step_000002"))
    train_rft(replace(cfg, out=str(resumed), resume=str(resumed)))
    a, b = (load_file(str(d / "model" / "model.safetensors")) for d in (full, resumed))
    assert all(torch.equal(a[k], b[k]) for k in a)
    for name in ("round_2/samples.jsonl", "round_3/hard_prompts.jsonl"):
        assert (full / name).read_text() == (resumed / name).read_text()
    assert [r["step"] for r in _rows(resumed)] == [1, 2, 3]


def test_bad_options_are_named():
    with pytest.raises(ConfigError, match=r"samples_per_prompt=0 must be >= 1.*retry_hard=2.0 must be in \[0, 1\]"):
        RFTConfig(retry_hard=2.0, samples_per_prompt=0).validate()
    with pytest.raises(ConfigError, match="reward 'rm' needs reward_model"):
        RFTConfig(rewards="rm=1.0").validate()


@pytest.mark.slow
def test_the_pipeline_ends_with_rft(tmp_path):
    from lmpo.cli.main import main

    out = tmp_path / "pipe"
    config = tmp_path / "small.yaml"
    config.write_text("cpt:\n  steps: 20\n  corpus_documents: 3000\n  eval_problems: 50\n"
                      "sft:\n  epochs: 1\n  demonstrations: 64\n  eval_problems: 50\n"
                      "rft:\n  rounds: 2\n  prompts_per_round: 8\n  samples_per_prompt: 4\n  sft_steps_per_round: 2\n"
                      "  eval_problems: 50\n  prompt_pool: 100\n")
    assert main(["pipeline", "--config", str(config), "--out", str(out), "--threads", "1", "--rl", "rft"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [s["name"] for s in summary["stages"]] == ["cpt", "sft", "rft"]
    assert (out / "rft" / "round_2" / "hard_prompts.jsonl").exists() and (out / "rft" / "report" / "rft.png").exists()


def test_the_command_trains_and_resumes_alone(start_model, tmp_path, capsys):
    from lmpo.cli.main import main

    run = tmp_path / "run"  # `lmpo train rft`, then `--resume` alone continues it with its own options
    flags = ["--model", start_model, "--rounds", "2", "--prompts_per_round", "4", "--samples_per_prompt", "3",
             "--rewards", VERIFIER, "--reward_timeout", "0", "--eval_problems", "0", "--max_new_tokens", "6",
             "--threads", "1"]
    assert main(["train", "rft", *flags, "--out", str(run)]) == 0
    for done in ("model", "checkpoints/step_000001"):  # as if killed in round 1
        shutil.rmtree(run / done)
    (run / "result.json").unlink()
    assert main(["train", "rft", "--resume", str(run)]) == 0
    assert "rft: held-out accuracy n/a" in capsys.readouterr().out and (run / "model").is_dir()


@pytest.mark.slow
def test_rft_raises_the_sft_checkpoints_accuracy(tmp_path):
    """The acceptance figure: from the task's SFT checkpoint (32.0% held-out, seed 0), the
    default RFT stage gains over 40 points (measured: 92.0%)."""
    from lmpo.teach.start import sft_start

    start = sft_start(seed=0, threads=1)
    result = train_rft(RFTConfig(model=start.model_dir, out=str(tmp_path / "rft"), threads=1))
    assert result.accuracy >= start.sft_accuracy + 0.4


@pytest.mark.parametrize("trainer", ["rft", "online_dpo"])
def test_progress_lines_show_eval_only_on_rounds_that_evaluated(trainer, start_model, tmp_path, capsys):
    """With --eval_every 2 the lines of rounds 1 and 3 repeated round 0's (then round 2's)
    held-out accuracy as if just measured (`eval 0.35`)."""
    from lmpo.trainers.online_dpo import OnlineDPOConfig, train_online_dpo

    if trainer == "rft":
        train_rft(_config(start_model, tmp_path / "run", rounds=4, eval_every=2))
    else:
        train_online_dpo(OnlineDPOConfig(model=start_model, out=str(tmp_path / "run"), rounds=4, prompts_per_round=4,
                                         samples_per_prompt=3, batch_size=4, max_new_tokens=6, rewards=VERIFIER,
                                         reward_timeout=0, eval_problems=8, eval_every=2, threads=1))
    lines = [line for line in capsys.readouterr().err.splitlines() if re.search(r"\] \w+ \d/4 ", line)]
    assert len(lines) == 4
    assert ["eval" in line for line in lines] == [False, True, False, True]


def test_a_run_that_accepted_nothing_says_keep_top_k_needs_an_open_threshold(start_model, tmp_path, capsys):
    """QA: the warning said "keep the best with --keep_top_k N" to a run that had --keep_top_k 1 and
    kept nothing: keep_top_k picks among the accepted samples, so it needs --accept_threshold -inf."""
    from lmpo.cli.main import main

    flags = ["--model", start_model, "--rounds", "1", "--prompts_per_round", "2", "--samples_per_prompt", "2",
             "--rewards", VERIFIER, "--reward_timeout", "0", "--eval_problems", "0", "--max_new_tokens", "4",
             "--threads", "1", "--accept_threshold", "5", "--keep_top_k", "1", "--out", str(tmp_path / "run")]
    assert main(["train", "rft", *flags]) == 0
    out = capsys.readouterr()
    assert "--accept_threshold -inf --keep_top_k N" in out.out + out.err
