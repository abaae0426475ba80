"""`run_pipeline(cfg, explicit=...)` refuses a name that is no option, before anything runs: a
misspelt (`rl_stage.betta`) or undotted (`beta`) name once protected nothing, in silence, and the
preset replaced the value it was meant to keep."""

from __future__ import annotations

import pytest

from lmpo.trainers.pipeline import PipelineConfig, resolve_pipeline, run_pipeline
from lmpo.trainers.rl_config import RLConfig
from lmpo.trainers.validation import ConfigError


def test_misspelt_name_is_refused_with_its_close_match(tmp_path, no_stage_runs):
    out = tmp_path / "pipe"
    cfg = PipelineConfig(out=str(out), rl_stage=RLConfig(beta=0.0, steps=7))
    with pytest.raises(ConfigError, match=r"explicit= names 'rl_stage.betta', which is not an option "
                                          r"\(did you mean rl_stage.beta\?\)"):
        run_pipeline(cfg, explicit={"rl_stage.betta", "rl_stage.steps"})
    assert not out.exists()


def test_undotted_name_lists_the_sections_that_have_it():
    with pytest.raises(ConfigError) as err:
        resolve_pipeline(PipelineConfig(rl_stage=RLConfig(beta=0.0)), explicit={"beta"})
    message = str(err.value)
    assert "explicit= names 'beta', which is not an option (did you mean " in message
    assert "rl_stage.beta" in message and "dpo.beta" in message


def test_one_string_is_refused():
    with pytest.raises(ConfigError, match=r"explicit='rl_stage.beta': expected a collection"):
        resolve_pipeline(PipelineConfig(), explicit="rl_stage.beta")


def test_known_names_still_keep_their_values():
    cfg = resolve_pipeline(PipelineConfig(rl="grpo", rl_stage=RLConfig(beta=0.0)), explicit={"rl_stage.beta"})
    assert cfg.rl_stage.beta == 0.0
    assert resolve_pipeline(PipelineConfig(rl="grpo"), explicit=set()).rl_stage.beta == 0.04
