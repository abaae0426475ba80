"""A policy loss, aggregation, KL estimator or advantage that names no registered function is
refused by `RLConfig.problems()`, so that a pipeline says so before its first stage runs (it was
said only when the RL stage built its loss, after CPT and SFT)."""

from __future__ import annotations

import pytest

from lmpo.cli.main import main
from lmpo.trainers.pipeline import PipelineConfig, run_pipeline
from lmpo.trainers.rl_config import RLConfig
from lmpo.trainers.validation import ConfigError


@pytest.mark.parametrize(("option", "value", "expected"), [
    ("loss", "ppo_clipp", "loss='ppo_clipp' (did you mean 'ppo_clip'?) is not one of cispo, gspo, gspo_token, ppo_clip"),
    ("aggregation", "token_means", "aggregation='token_means' (did you mean 'token_mean'?) is not one of "
                                   "seq_mean_token_mean, seq_mean_token_sum_norm, token_mean"),
    ("kl_estimator", "k3ratio", "kl_estimator='k3ratio' (did you mean 'k3_ratio'?) is not one of k1, k2, k3, k3_ratio"),
    ("advantage", "grp", "advantage='grp' (did you mean 'grpo'?) is not one of dr_grpo, grpo, rloo, gae, reinforce_pp"),
    ("loss", "nothing_like_it", "loss='nothing_like_it' is not one of cispo, gspo, gspo_token, ppo_clip"),
])
def test_problems_name_the_unknown_name(option, value, expected):
    problems = RLConfig(**{option: value}).problems()
    assert expected in problems, problems


def test_pipeline_refuses_before_cpt(tmp_path, no_stage_runs):
    out = tmp_path / "pipe"
    with pytest.raises(ConfigError, match="loss='ppo_clipp' \\(did you mean 'ppo_clip'\\?\\) is not one of"):
        run_pipeline(PipelineConfig(out=str(out), rl_stage=RLConfig(loss="ppo_clipp")))
    assert not out.exists()


def test_pipeline_cli_refuses_before_cpt(tmp_path, capsys, no_stage_runs):
    out = tmp_path / "pipe"
    assert main(["pipeline", "--rl_stage.loss", "ppo_clipp", "--out", str(out), "--threads", "1"]) != 0
    assert "(did you mean 'ppo_clip'?)" in capsys.readouterr().err
    assert not out.exists()
