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


@pytest.mark.parametrize("flags, said", [
    (["--sft.chat_template", "{missing}"], "--sft.chat_template {missing}: cannot read it"),
    (["--rl", "dpo", "--dpo.chat_template_kwargs", "{bad"], "--dpo.chat_template_kwargs '{bad': expected a JSON object"),
])
def test_a_later_stages_chat_template_is_refused_before_cpt_runs(flags, said, tmp_path, capsys, no_stage_runs):
    """A missing --sft.chat_template file (or bad template variables) was found only when SFT
    started, after the whole CPT stage, and named `--chat_template`, which `lmpo pipeline` refuses."""
    from lmpo.cli.main import main

    missing = str(tmp_path / "none.jinja")
    flags = [f.replace("{missing}", missing) for f in flags]
    assert main(["pipeline", "--out", str(tmp_path / "pipe"), *flags]) == 2
    assert said.replace("{missing}", missing) in capsys.readouterr().err
    assert not (tmp_path / "pipe").exists()


def test_a_stages_refusal_names_the_pipelines_flags(tmp_path, capsys, monkeypatch):
    """A stage's message names its options as the pipeline takes them (`--cpt.lr`), the options the
    pipeline sets for every stage as they are (`--seed`), and dotted or unknown ones untouched."""
    from lmpo.cli.main import main

    def train_cpt(cfg):
        raise ValueError("--chat_template x.jinja: no; lower --lr or --seed 1; --sft.epochs; --no_such_flag")

    monkeypatch.setattr("lmpo.trainers.pipeline.train_cpt", train_cpt)
    assert main(["pipeline", "--out", str(tmp_path / "pipe")]) == 2
    assert ("lmpo: error: --cpt.chat_template x.jinja: no; lower --cpt.lr or --seed 1; --sft.epochs; --no_such_flag"
            in capsys.readouterr().err)
