"""An option typed `Literal[...]` given a value that is none of its choices is refused from the
Python API as the command line refuses it, before anything runs: `kl_placement="rewards"` once
dropped the KL term in silence, `overlong="truncate"` acted as the default."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from lmpo.teach.compare.plan import CompareConfig
from lmpo.trainers.harness import RunOptions
from lmpo.trainers.pipeline import PipelineConfig, run_pipeline
from lmpo.trainers.rl import train_rl
from lmpo.trainers.rl_config import RLConfig
from lmpo.trainers.validation import ConfigError


def _subclasses(cls: type) -> set[type]:
    return {sub for direct in cls.__subclasses__() for sub in (direct, *_subclasses(direct))}


# every trainer's config (each shares RunOptions) and the other configs with a Literal option
CONFIGS = sorted({c for c in _subclasses(RunOptions) if callable(getattr(c, "validate", None))} | {CompareConfig},
                 key=lambda c: c.__qualname__)


def _literal_fields(cls: type) -> list[tuple[str, tuple]]:
    hints = typing.get_type_hints(cls)
    return [(f.name, typing.get_args(hints[f.name])) for f in dataclasses.fields(cls)
            if typing.get_origin(hints[f.name]) is typing.Literal]


CASES = [(cls, name, choices) for cls in CONFIGS for name, choices in _literal_fields(cls)]


def test_every_trainer_config_is_covered():
    names = {c.__name__ for c in CONFIGS}
    assert {"RLConfig", "CPTConfig", "SFTConfig", "PreferenceConfig", "KTOConfig", "ORPOConfig", "RFTConfig",
            "OnlineDPOConfig", "RewardModelConfig", "CompareConfig"} <= names
    assert len(CASES) > 20


@pytest.mark.parametrize(("cls", "name", "choices"), CASES,
                         ids=[f"{c.__name__}.{n}" for c, n, _ in CASES])
def test_validate_refuses_a_value_outside_the_choices(cls, name, choices):
    cfg = cls(**{name: "bogus"})
    expected = f"{name}='bogus': expected one of {', '.join(map(str, choices))}"
    with pytest.raises(ValueError, match="expected one of") as err:
        cfg.validate()
    assert expected in str(err.value)


@pytest.mark.parametrize(("option", "value", "choices"), [
    ("kl_placement", "rewards", "loss, reward"), ("overlong", "truncate", "none, mask, penalty"),
    ("whiten_std", "Sample", "population, sample"), ("whiten_over", "Sequences", "tokens, sequences"),
    ("std", "bessel", "sample, population"), ("scale", "groups", "group, batch, none"),
])
def test_rl_refuses_before_the_run_directory(tmp_path, option, value, choices):
    out = tmp_path / "run"
    cfg = RLConfig(model="/nonexistent/model", out=str(out), beta=0.1, **{option: value})
    assert f"{option}={value!r}: expected one of {choices}" in cfg.problems()
    with pytest.raises(ConfigError, match=f"{option}={value!r}: expected one of {choices}"):
        train_rl(cfg)
    assert not out.exists()


def test_said_once_in_a_validate_message():
    with pytest.raises(ConfigError) as err:
        RLConfig(loss="cispo", ratio_level="seq", reward_failure="skip", precision="fp16").validate()
    message = str(err.value)
    for part in ("ratio_level='seq': expected one of token, sequence",
                 "reward_failure='skip': expected one of unscorable, error",
                 "precision='fp16': expected one of auto, fp32, bf16"):
        assert message.count(part.partition(":")[0]) == 1, message
        assert part in message


def test_pipeline_refuses_before_anything_runs(tmp_path, no_stage_runs):
    out = tmp_path / "pipe"
    cfg = PipelineConfig(out=str(out), rl_stage=RLConfig(kl_placement="rewards"))
    with pytest.raises(ConfigError, match="kl_placement='rewards': expected one of loss, reward"):
        run_pipeline(cfg)
    assert not out.exists()


def test_optional_literal_allows_none():
    from lmpo.trainers.validation import literal_problems

    @dataclasses.dataclass
    class Options:
        mode: typing.Optional[typing.Literal["a", "b"]] = None

    assert literal_problems(Options()) == []
    assert literal_problems(Options(mode="c")) == ["mode='c': expected one of a, b"]
