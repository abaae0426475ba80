"""Run directories at their edges: a pipeline and a single stage never share one, a kill during
the final model write leaves nothing behind, and a pipeline its first stage refuses leaves no
directory."""

from __future__ import annotations

import shutil

import pytest

from lmpo.cli.main import main

from hardening_common import SFT_RUN, error_line as _error


def test_a_pipeline_over_a_stage_run_or_a_stage_over_a_pipeline_is_refused(start_model, tmp_path, capsys):
    """`lmpo pipeline --out OTHER_PIPELINE/sft` deleted that SFT stage's metrics and config and buried
    a new pipeline inside it; `lmpo train sft --out PIPELINE` mixed a model/ into the pipeline's
    files. Re-running the same kind in a directory still replaces the earlier run."""
    stage = tmp_path / "pipe" / "sft"
    assert main(["train", "sft", "--model", start_model, "--out", str(stage), *SFT_RUN]) == 0
    before = sorted(p.name for p in stage.iterdir())
    assert main(["pipeline", "--out", str(stage), "--threads", "1"]) == 2
    assert _error(capsys) == (f"lmpo: error: --out {stage}: holds a finished or interrupted sft run; this pipeline "
                              f"there would mix its files with that one's and delete some of them, so choose another "
                              f"--out (or delete {stage} first)")
    assert sorted(p.name for p in stage.iterdir()) == before
    pipe = tmp_path / "pipe"
    (pipe / "run.json").write_text('{"trainer": "pipeline", "command": null, "config": {}}')
    assert main(["train", "sft", "--model", start_model, "--out", str(pipe), *SFT_RUN]) == 2
    assert "holds a pipeline, whose stages are in its sub-directories; this sft run there" in _error(capsys)
    assert main(["train", "sft", "--model", start_model, "--out", str(stage), *SFT_RUN]) == 0  # the same kind: replaced


def test_what_a_kill_during_the_final_model_write_left_is_tidied(start_model, tmp_path, capsys):
    """Before, a run killed while writing model/ left `.model-new-PID` (a whole model's size) for
    good; killed between the two renames of the swap, its only model was `.model-old-PID`."""
    from lmpo.trainers.run_dir import tidy_interrupted_swaps

    run = tmp_path / "sft"
    assert main(["train", "sft", "--model", start_model, "--out", str(run), *SFT_RUN]) == 0
    (run / ".model-new-123").mkdir()
    (run / ".model-new-123" / "model.safetensors").write_bytes(b"half")
    (run / ".model-old-456").mkdir()
    (run / "result.json").unlink()  # as if killed while writing its model
    assert main(["train", "sft", "--resume", str(run), *SFT_RUN]) == 0
    assert sorted(p.name for p in run.glob(".model-*")) == []
    # killed between the renames: model/ is gone and the old one waits aside; it is put back
    (run / "model").rename(run / ".model-old-789")
    (run / ".model-new-789").mkdir()
    tidy_interrupted_swaps(run)
    assert (run / "model" / "model.safetensors").is_file() and not list(run.glob(".model-*"))


def test_a_pipeline_its_first_stage_refuses_leaves_no_directory(tmp_path, capsys):
    """The CPT stage's own check (a corpus too small for one batch) came after the pipeline had
    created and locked --out: a refused pipeline left `.lock`, `config.json` and `run.json`."""
    out = tmp_path / "pl"
    assert main(["pipeline", "--out", str(out), "--cpt.steps", "3", "--cpt.eval_problems", "2",
                 "--cpt.corpus_documents", "50", "--cpt.heldout_documents", "10", "--threads", "1"]) == 2
    assert "fewer than one batch of 32" in _error(capsys)
    assert not out.exists()
    out.mkdir()  # a directory the user made is theirs: kept
    assert main(["pipeline", "--out", str(out), "--cpt.steps", "3", "--cpt.eval_problems", "2",
                 "--cpt.corpus_documents", "50", "--cpt.heldout_documents", "10", "--threads", "1"]) == 2
    assert out.is_dir()


@pytest.mark.slow  # two small pipelines: about 30 s of CPU
def test_a_pipeline_run_again_with_another_last_stage_removes_the_earlier_ones(tmp_path, capsys):
    """`--rl dpo` into a directory where `--rl grpo` ran left grpo/ beside dpo/, and
    `lmpo doctor` diagnosed it as part of the new pipeline."""
    out = tmp_path / "pl"
    small = ["--out", str(out), "--threads", "1", "--cpt.steps", "2", "--cpt.eval_problems", "2",
             "--sft.demonstrations", "16", "--sft.epochs", "1", "--sft.eval_problems", "2"]
    assert main(["pipeline", *small, "--rl_stage.steps", "1", "--rl_stage.eval_problems", "2"]) == 0
    assert (out / "grpo" / "run.json").is_file()
    (out / "notes").mkdir()  # the user's own: kept
    assert main(["pipeline", *small, "--rl", "dpo", "--dpo.pairs", "16", "--dpo.eval_problems", "2"]) == 0
    assert f"{out / 'grpo'}: removed, a stage of the earlier pipeline" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["cpt", "dpo", "notes", "report", "sft"]
    assert main(["doctor", str(out)]) == 0
    assert "grpo" not in capsys.readouterr().out


def test_an_interrupted_pipeline_names_its_stage_and_how_to_continue_it(tmp_path):
    """Ctrl-C in a pipeline printed only `lmpo: interrupted`, though its stage had checkpoints
    that `lmpo pipeline --resume DIR` continues."""
    from lmpo.cli.pipeline import _pipeline_resume_hint

    out = tmp_path / "pl"
    again = (f"continue it with `lmpo pipeline --resume {out}` (its finished stages are kept); `lmpo pipeline "
             f"--out {out} --overwrite true` starts every stage afresh")
    assert _pipeline_resume_hint(out) == f"pipeline interrupted; {again}"
    (out / "cpt" / "checkpoints" / "step_000060").mkdir(parents=True)
    (out / "cpt" / "checkpoints" / "step_000060" / "COMPLETE").write_text("ok\n")
    (out / "cpt" / "run.json").write_text('{"trainer": "cpt", "command": null, "config": {}}')
    assert _pipeline_resume_hint(out) == (f"pipeline interrupted in its cpt stage (its newest complete checkpoint "
                                          f"is step_000060); {again}")


@pytest.mark.parametrize("save_every", [2, 0])
def test_sigterm_in_a_pipeline_says_where_it_stopped(save_every, tmp_path):
    """SIGTERM to `lmpo pipeline` ended it with 143 and printed nothing. Now a stage that
    checkpoints stops after its step with a checkpoint there, as `lmpo train` does; one that does
    not unwinds as Ctrl-C would; both name the stage and the command that continues it."""
    import os
    import subprocess
    import sys

    out = tmp_path / "pl"
    env = {**os.environ, "LMPO_TERM_AT": "step_end:3"}  # after step 3 and its checkpoint decision
    done = subprocess.run([sys.executable, "-m", "lmpo", "pipeline", "--out", str(out), "--threads", "1",
                           "--cpt.steps", "6", "--cpt.eval_problems", "2", "--cpt.save_every", str(save_every)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 143, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    if save_every:
        assert last.startswith(f"lmpo: stopped by SIGTERM after step 4; checkpoint {out / 'cpt'}/checkpoints/"
                               f"step_000004 written; pipeline interrupted in its cpt stage (its newest complete "
                               f"checkpoint is step_000004); "), last
        assert (out / "cpt" / "checkpoints" / "step_000004" / "COMPLETE").is_file()
        assert f"continue it with `lmpo pipeline --resume {out}`" in last
    else:
        assert last.startswith("lmpo: pipeline interrupted in its cpt stage ("), last
    assert not (out / "sft").exists()


RFT_RUN = ["--prompts_per_round", "4", "--samples_per_prompt", "3", "--max_new_tokens", "6", "--prompt_pool", "20",
           "--rewards", "reward_fns:count_sevens=1.0", "--reward_timeout", "0", "--sft_steps_per_round", "1",
           "--batch_size", "2", "--eval_problems", "0", "--threads", "1"]


def _rounds(run) -> list[str]:
    return sorted(p.name for p in run.glob("round_*"))


def test_a_new_run_removes_an_earlier_rft_runs_rounds_and_only_them(tmp_path):
    """`round_3/`..`round_5/` of a 5-round RFT run stayed beside a 2-round run's `round_1/`,
    `round_2/` (and under another trainer's run), read as this run's by whoever opened them."""
    from lmpo.trainers.rft import HARD_PROMPTS, SAMPLES
    from lmpo.trainers.run_dir import RFT_ROUND_FILES, _clear_earlier_run

    assert {HARD_PROMPTS, SAMPLES} == RFT_ROUND_FILES
    run = tmp_path / "run"
    for k in (1, 2, 3):
        (run / f"round_{k}").mkdir(parents=True)
        (run / f"round_{k}" / SAMPLES).write_text("{}\n")
        (run / f"round_{k}" / HARD_PROMPTS).write_text("")
    (run / "round_4").mkdir()  # created, killed before its files: RFT's too
    (run / "round_5").mkdir()
    (run / "round_5" / "notes.txt").write_text("mine")  # not RFT's files: not its round
    (run / "round_x").mkdir()
    (run / "round_6").write_text("a file")
    (run / "run.json").write_text('{"trainer": "rft"}')
    (run / "result.json").write_text("{}")
    _clear_earlier_run(run, "rft", overwrite=False)
    assert _rounds(run) == ["round_5", "round_6", "round_x"]
    other = tmp_path / "other"  # no run.json: nothing says a run wrote them, nothing is removed
    (other / "round_1").mkdir(parents=True)
    _clear_earlier_run(other, "rft", overwrite=False)
    assert _rounds(other) == ["round_1"]


def test_rft_rounds_go_with_the_run_they_belong_to_and_stay_on_resume(start_model, tmp_path, capsys):
    run = tmp_path / "rft"
    train = ["train", "rft", "--model", start_model, *RFT_RUN]
    assert main([*train, "--rounds", "3", "--out", str(run)]) == 0
    assert _rounds(run) == ["round_1", "round_2", "round_3"]
    assert main([*train, "--rounds", "1", "--seed", "1", "--out", str(run)]) == 0  # a finished run replaced
    assert "replacing the finished run there" in capsys.readouterr().out and _rounds(run) == ["round_1"]

    assert main([*train, "--rounds", "3", "--out", str(run)]) == 0  # interrupted in round 3, resumed
    first = (run / "round_1" / "samples.jsonl").read_text()
    shutil.rmtree(run / "model")
    shutil.rmtree(run / "checkpoints" / "step_000002")
    (run / "result.json").unlink()
    assert main(["train", "rft", "--resume", str(run)]) == 0
    assert _rounds(run) == ["round_1", "round_2", "round_3"] and (run / "round_1" / "samples.jsonl").read_text() == first

    (run / "result.json").unlink()  # interrupted again, then a fresh start with --overwrite
    assert main([*train, "--rounds", "2", "--out", str(run), "--overwrite", "true"]) == 0
    assert _rounds(run) == ["round_1", "round_2"]
    assert main(["train", "sft", "--model", start_model, "--out", str(run), *SFT_RUN]) == 0  # another trainer
    assert _rounds(run) == []


@pytest.mark.parametrize("save_every", ["1", "0"])
def test_a_full_disk_while_writing_the_final_model_exits_2_naming_the_checkpoint(start_model, tmp_path, capsys,
                                                                                monkeypatch, save_every):
    """It exited 1 with 'cannot write .model-new-PID: no space left' and left that directory
    behind, without the intact checkpoint and the resume command a full disk mid-checkpoint names."""
    import errno

    def full(model, tokenizer, out, merged=False):
        out.mkdir(parents=True, exist_ok=True)
        (out / "model.safetensors").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device", str(out))

    monkeypatch.setattr("lmpo.trainers.harness.save_model", full)
    run = tmp_path / "run"
    flags = [*SFT_RUN, "--save_every", save_every]  # the last --save_every counts
    assert main(["train", "sft", "--model", start_model, "--out", str(run), *flags]) == 2
    line = _error(capsys)
    assert f"cannot write {run / 'model'}: no space left on the device" in line
    if save_every == "1":
        assert f"the newest checkpoint {run / 'checkpoints' / 'step_000001'} is intact and `--resume {run}`" in line
    else:
        assert "no checkpoint was kept (--save_every 0), so the training is lost" in line
    assert not list(run.glob(".model-new-*")) and not (run / "model").exists()
