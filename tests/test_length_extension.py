"""`--resume RUN --epochs N` (SFT, the reward model, DPO, KTO, ORPO) and online DPO's `--rounds N`
with more than the run planned: allowed where nothing computed so far depends on the total (a
constant learning-rate schedule: the data order of an epoch, or a round's prompts, never does), and
then the run ends with the weights and step rows of a run planned that long from the start, bit
for bit, interrupted or finished; refused in one line where the schedule decays over the run."""

from __future__ import annotations

import json

import pytest

from lmpo.cli.main import main
from lmpo.trainers.checkpoint import check_same_config
from tests.test_max_minutes_resume import _same_model
from tests.test_steps_extension import _rows

SFT = ["train", "sft", "--demonstrations", "24", "--batch_size", "8", "--eval_problems", "0", "--log_every", "1",
       "--save_every", "2", "--warmup_steps", "1", "--threads", "1"]  # 3 steps an epoch
DPO = ["--pairs", "12", "--batch_size", "4", "--eval_problems", "0", "--log_every", "1", "--save_every", "2",
       "--warmup_steps", "1", "--threads", "1"]  # 3 steps an epoch
RM = ["train", "rm", "--pairs", "12", "--heldout_pairs", "4", "--batch_size", "4", "--log_every", "1",
      "--save_every", "2", "--warmup_steps", "1", "--threads", "1"]
ONLINE = ["train", "online_dpo", "--prompts_per_round", "4", "--samples_per_prompt", "4", "--max_new_tokens", "48",
          "--batch_size", "2", "--lr", "1e-3", "--rewards", "reward_fns:count_sevens=1.0", "--reward_timeout", "0",
          "--eval_problems", "0", "--save_every", "2", "--warmup_steps", "1", "--threads", "1"]
CONSTANT = ["--lr_schedule", "constant"]


def _all_rows(out) -> list[dict]:
    """Every row, without its timings (the machine's, not the run's)."""
    rows = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    return [{k: v for k, v in r.items() if not (k.endswith("_s") or "per_s" in k)} for r in rows]


def _refusal(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("lmpo:")]
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("term_at", [2, 4])  # stops at the checkpoint after step 3 (an epoch's end), or 5
def test_an_interrupted_sft_run_is_given_more_epochs_like_a_longer_run(term_at, start_model, tmp_path, monkeypatch):
    argv = [*SFT, "--model", start_model, *CONSTANT]
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main([*argv, "--epochs", "4", "--out", str(full)]) == 0
    monkeypatch.setenv("LMPO_TERM_AT", f"step_end:{term_at}")
    assert main([*argv, "--epochs", "2", "--out", str(cut)]) == 143
    monkeypatch.delenv("LMPO_TERM_AT")
    assert main(["train", "sft", "--resume", str(cut), "--epochs", "4"]) == 0
    assert _same_model(full, cut) and _rows(cut) == _rows(full)
    assert [r["step"] for r in _rows(cut)] == list(range(1, 13))


@pytest.mark.parametrize("trainer", ["dpo", "kto", "orpo"])
def test_a_finished_offline_run_is_given_more_epochs_from_its_newest_checkpoint(trainer, start_model, tmp_path,
                                                                               capsys):
    pairs = ["--pairs", "6"] if trainer == "kto" else []  # KTO's examples: each pair's two halves
    argv = ["train", trainer, "--model", start_model, *DPO, *CONSTANT, *pairs]
    full, done = tmp_path / "full", tmp_path / "done"
    assert main([*argv, "--epochs", "3", "--out", str(full)]) == 0
    assert main([*argv, "--epochs", "1", "--out", str(done)]) == 0
    capsys.readouterr()
    assert main(["train", trainer, "--resume", str(done), "--epochs", "3"]) == 0
    out = capsys.readouterr().out
    assert "finished; going on to the longer --epochs from its newest checkpoint, step_000002" in out
    if trainer != "orpo":  # ORPO has no reference; the others score only the batches of the new epochs
        assert "reference log-probs of 3 of 9 batches read from" in out
    assert out.count("minutes trained before this resume") == 1  # the checkpoint's time, not the pass's too
    assert _same_model(full, done) and _rows(done) == _rows(full)
    assert [r["step"] for r in _rows(done)] == list(range(1, 10))
    assert json.loads((done / "result.json").read_text())["config"]["epochs"] == 3


def test_a_reward_model_is_given_more_epochs(start_model, tmp_path):
    argv = [*RM, "--model", start_model, *CONSTANT]
    full, done = tmp_path / "full", tmp_path / "done"
    assert main([*argv, "--epochs", "3", "--out", str(full)]) == 0
    assert main([*argv, "--epochs", "2", "--out", str(done)]) == 0
    assert main(["train", "rm", "--resume", str(done), "--epochs", "3"]) == 0
    assert _same_model(full, done) and _rows(done) == _rows(full)


def test_an_extension_killed_and_resumed_twice_ends_like_the_longer_run(start_model, tmp_path, monkeypatch, capsys):
    """Killed in the added epochs, then resumed plainly (the options of its newest checkpoint: 4
    epochs), then once more with the finished length: refused, nothing retrained."""
    argv = ["train", "dpo", "--model", start_model, *DPO, *CONSTANT]
    full, run = tmp_path / "full", tmp_path / "run"
    assert main([*argv, "--epochs", "4", "--out", str(full)]) == 0
    assert main([*argv, "--epochs", "2", "--out", str(run)]) == 0
    monkeypatch.setenv("LMPO_TERM_AT", "step_end:9")
    assert main(["train", "dpo", "--resume", str(run), "--epochs", "4"]) == 143
    monkeypatch.delenv("LMPO_TERM_AT")
    assert not (run / "result.json").exists()
    assert main(["train", "dpo", "--resume", str(run)]) == 0
    assert _same_model(full, run) and _rows(run) == _rows(full)
    written = (run / "model" / "model.safetensors").stat().st_mtime_ns
    capsys.readouterr()
    assert main(["train", "dpo", "--resume", str(run), "--epochs", "4"]) == 2
    assert "that run finished (result.json), so there is nothing to resume" in _refusal(capsys)
    assert (run / "model" / "model.safetensors").stat().st_mtime_ns == written


def test_a_finished_online_dpo_run_is_given_more_rounds(start_model, tmp_path, capsys):
    argv = [*ONLINE, "--model", start_model, *CONSTANT]
    full, done = tmp_path / "full", tmp_path / "done"
    assert main([*argv, "--rounds", "6", "--out", str(full)]) == 0
    assert main([*argv, "--rounds", "4", "--out", str(done)]) == 0
    capsys.readouterr()
    assert main(["train", "online_dpo", "--resume", str(done), "--rounds", "6"]) == 0
    assert "going on to the longer --rounds from its newest checkpoint, step_000002 (the rounds after it" in \
        capsys.readouterr().out
    rounds = [r for r in _all_rows(done) if "round" in r]
    assert _same_model(full, done) and rounds == [r for r in _all_rows(full) if "round" in r]
    assert [r["round"] for r in rounds] == list(range(1, 7)) and sum(r["pairs"] for r in rounds[4:]) > 0


def test_a_decaying_schedule_refuses_more_epochs_saying_why(start_model, tmp_path, capsys, monkeypatch):
    run = tmp_path / "sft"
    monkeypatch.setenv("LMPO_TERM_AT", "step_end:3")
    assert main([*SFT, "--model", start_model, "--epochs", "2", "--out", str(run)]) == 143  # cosine, the default
    monkeypatch.delenv("LMPO_TERM_AT")
    capsys.readouterr()
    assert main(["train", "sft", "--resume", str(run), "--epochs", "4"]) == 2
    err = _refusal(capsys)
    assert ("epochs=4 (was 2): the cosine learning-rate schedule decays over the run's steps (--epochs passes over "
            "the data), so the steps already trained would have had other rates in a run of 4 epochs; only a run "
            "with --lr_schedule constant can be extended") in err
    assert (f"to train further, finish this run with its --epochs 2, then start a new run from its model "
            f"(--model {run / 'model'})") in err


def test_a_decaying_schedule_refuses_more_rounds(start_model, tmp_path, capsys):
    run = tmp_path / "online"
    assert main([*ONLINE, "--model", start_model, "--rounds", "3", "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["train", "online_dpo", "--resume", str(run), "--rounds", "5"]) == 2
    err = _refusal(capsys)
    assert "rounds=5 (was 3): the cosine learning-rate schedule decays over the run's --rounds" in err
    assert f"that run finished, so to train further start a new run from its model (--model {run / 'model'})" in err


def test_only_the_option_that_says_how_long_a_run_is_may_grow():
    """Online DPO's --epochs are passes over each round's pairs (what a round computes), and RFT's
    --sft_steps_per_round a round's steps: both stay refused, as fewer epochs are; RFT's rounds grow
    as online DPO's do (tests/test_rft_rounds_extension.py)."""
    online = {"rounds": 4, "epochs": 1, "lr_schedule": "constant"}
    with pytest.raises(ValueError, match=r"options differ from the interrupted run: epochs=2 \(was 1\)"):
        check_same_config(online, {**online, "epochs": 2}, "")
    check_same_config(online, {**online, "rounds": 8}, "")
    rft = {"rounds": 4, "sft_steps_per_round": 2, "lr_schedule": "constant"}
    check_same_config(rft, {**rft, "rounds": 8}, "")
    with pytest.raises(ValueError, match=r"options differ from the interrupted run: sft_steps_per_round=4 \(was 2\)"):
        check_same_config(rft, {**rft, "sft_steps_per_round": 4}, "")
    cosine = {**online, "lr_schedule": "cosine"}  # the refusal of more rounds names the other change too
    with pytest.raises(ValueError, match=r"rounds=8 \(was 4\): the cosine .*; other options differ too: epochs=2 "
                                         r"\(was 1\)$"):
        check_same_config(cosine, {**cosine, "rounds": 8, "epochs": 2}, "")
    sft = {"epochs": 3, "lr_schedule": "constant"}
    with pytest.raises(ValueError, match=r"epochs=2 \(was 3\)"):
        check_same_config(sft, {**sft, "epochs": 2}, "")


def test_a_pipelines_finished_stage_of_fewer_epochs_is_not_kept_as_one_of_more(tmp_path):
    """More epochs may continue a stage's run, but its finished run of fewer is not that stage."""
    from lmpo.trainers.pipeline_resume import finished_stage
    from lmpo.trainers.supervised import SFTConfig

    stage = SFTConfig(out=str(tmp_path / "sft"), lr_schedule="constant", epochs=2)
    (tmp_path / "sft" / "model").mkdir(parents=True)
    record = {"name": "sft", "seconds": 1.0, "model_dir": str(tmp_path / "sft" / "model"), "run_dir": stage.out,
              "config": json.loads(json.dumps(stage.__dict__))}
    (tmp_path / "sft" / "result.json").write_text(json.dumps(record))
    assert finished_stage(stage) is not None
    stage.epochs = 4
    assert finished_stage(stage) is None
