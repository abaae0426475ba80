"""`lmpo pipeline --resume DIR --STAGE.epochs N` (or `.steps`): a stage's length changes by the rule
of `lmpo train STAGE --resume` applied to that stage's directory. Before, the pipeline refused any
such change ("options differ ... repeat the run's own options") where the stage itself would go on."""

from __future__ import annotations

import subprocess
import sys

from tests.test_pipeline_resume import _pipeline, _weights


def _resume(out, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lmpo", "pipeline", "--resume", str(out), *extra],
                          capture_output=True, text=True, timeout=900)


def test_a_finished_constant_schedule_stage_is_given_more_epochs_like_a_longer_pipeline(tmp_path):
    constant = ("--sft.lr_schedule", "constant")
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert _pipeline(whole, *constant, "--sft.epochs", "3").returncode == 0
    assert _pipeline(cut, *constant, env={"LMPO_KILL_AT": "after_rollout:3"}).returncode == -9  # in GRPO
    resumed = _resume(cut, "--sft.epochs", "3")
    assert resumed.returncode == 0, resumed.stderr
    assert f"[sft] {cut / 'sft'} finished; going on to the longer --epochs from its newest checkpoint" in resumed.stdout
    assert _weights(cut) == _weights(whole)


def test_a_stage_not_begun_takes_any_length_and_one_that_trained_is_refused_naming_it(tmp_path):
    whole, cut = tmp_path / "whole", tmp_path / "cut"  # the default cosine schedule
    assert _pipeline(whole, "--sft.epochs", "3").returncode == 0
    assert _pipeline(cut, env={"LMPO_KILL_AT": "checkpoint_write:4"}).returncode == -9  # in CPT
    refused = _resume(cut, "--cpt.steps", "8")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1] == (
        f"lmpo: error: --resume {cut}: cpt.steps=8 (was 6): the cosine learning-rate schedule decays over the run's "
        f"--steps, so the steps already trained would have had other rates in a run of 8; only a run with "
        f"--cpt.lr_schedule constant can be extended, and its cpt stage has trained ({cut / 'cpt'}); resume with the "
        f"pipeline's own --cpt.steps 6, then train {cut / 'cpt' / 'model'} further in a new run")
    resumed = _resume(cut, "--sft.epochs", "3")  # SFT has not begun: it starts as the longer run
    assert resumed.returncode == 0, resumed.stderr
    assert _weights(cut) == _weights(whole)
