import dataclasses
from dataclasses import dataclass, field
from typing import Literal

import pytest

from lmpo.cli.config import ConfigError, build, field_docs
from lmpo.cli.main import main, make_parser


@dataclass
class Inner:
    steps: int = 3
    """How many steps."""


@dataclass
class Outer:
    lr: float = 0.1
    """Learning rate."""
    mode: Literal["a", "b"] = "a"
    """Which mode."""
    name: str = "x"
    """A name."""
    flag: bool = False
    """A switch."""
    inner: Inner = field(default_factory=Inner)
    """A section."""


def test_precedence_defaults_preset_yaml_flags(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("lr: 0.5\ninner:\n  steps: 7\nmode: b\n")
    cfg = build(Outer, preset={"name": "p", "lr": 0.2}, yaml_file=str(f), flags={"lr": "0.9", "flag": "true"})
    assert (cfg.lr, cfg.inner.steps, cfg.mode, cfg.name, cfg.flag) == (0.9, 7, "b", "p", True)


def test_unknown_yaml_key_names_file_line_and_key(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("lr: 0.5\ninner:\n  stepz: 7\n")
    with pytest.raises(ConfigError, match=r"c.yaml: line 3: inner.stepz: unknown option"):
        build(Outer, yaml_file=str(f))


@pytest.mark.parametrize("text,match", [("lr: fast\n", "line 1: lr: expected a number"),
                                        ("inner:\n  steps: 2.5\n", "line 2: inner.steps: expected an integer"),
                                        ("mode: c\n", "expected one of a, b"),
                                        ("flag: maybe\n", "expected true or false"),
                                        ("- 1\n- 2\n", "expected a mapping"),
                                        ("lr: [1\n", r"c.yaml: line 2, column 1: not valid YAML: expected ',' or ']'"),
                                        ("a: 1\n b: 2\n", "line 2, column 3: not valid YAML: mapping values are not allowed"),
                                        ("lr: \"fast\n", "line 2, column 1: not valid YAML: found unexpected end of stream")])
def test_ill_typed_yaml_values_are_errors(tmp_path, text, match):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=match):
        build(Outer, yaml_file=str(f))


def test_a_yaml_mapping_under_a_string_option_is_its_json(tmp_path):
    """`chat_template_kwargs: {enable_thinking: false}` is the option's value, as JSON text (the
    form its flag takes), not a section with an unknown option `enable_thinking`."""
    f = tmp_path / "c.yaml"
    f.write_text("name: {enable_thinking: false}\ninner:\n  steps: 2\n")
    cfg = build(Outer, yaml_file=str(f))
    assert (cfg.name, cfg.inner.steps) == ('{"enable_thinking": false}', 2)


def test_bad_flag_value_names_the_flag():
    with pytest.raises(ConfigError, match="--inner.steps: expected an integer"):
        build(Outer, flags={"inner.steps": "many"})


def test_yaml_errors_are_one_line_and_name_the_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("lr: [1\n")
    with pytest.raises(ConfigError) as info:
        build(Outer, yaml_file=str(f))
    assert "\n" not in str(info.value) and "<unicode string>" not in str(info.value)
    f.write_bytes(b"\xff\xfelr: 1\n")
    with pytest.raises(ConfigError, match=r"c.yaml: line 1: not valid UTF-8: byte 0xff at offset 0 \(a UTF-16 "
                                          r"byte-order mark: the file is UTF-16\); a config file is UTF-8 text"):
        build(Outer, yaml_file=str(f))


def test_a_config_that_is_not_utf8_names_the_line_and_byte(tmp_path):
    """It said `not valid UTF-8 (byte 17)`: neither which byte, nor on which line, nor that 17 was an offset."""
    f = tmp_path / "c.yaml"
    f.write_bytes(b"lr: 1\nout: caf\xe9\n")  # Latin-1, as an old editor saves it
    with pytest.raises(ConfigError) as info:
        build(Outer, yaml_file=str(f))
    assert str(info.value) == (f"{f}: line 2: not valid UTF-8: byte 0xe9 at offset 14; a config file is UTF-8 text: "
                               f"save it as UTF-8")


def test_missing_config_file():
    with pytest.raises(ConfigError, match="does not exist"):
        build(Outer, yaml_file="/nonexistent/c.yaml")


def test_every_option_of_every_command_is_documented():
    from lmpo.trainers.pipeline import PipelineConfig
    from lmpo.trainers.rl_config import RLConfig
    from lmpo.trainers.supervised import CPTConfig, SFTConfig

    for cls in (PipelineConfig, RLConfig, CPTConfig, SFTConfig):
        docs = field_docs(cls)
        missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
        assert not missing, f"{cls.__name__} fields without a docstring: {missing}"


@pytest.mark.parametrize("argv", [[], ["pipeline"], ["train"], ["train", "cpt"], ["train", "sft"], ["train", "grpo"],
                                  ["train", "rl"], ["report"], ["presets"]])
def test_help_of_every_command(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        make_parser().parse_args([*argv, "--help"])
    assert exit_info.value.code == 0
    assert "usage: lmpo" in capsys.readouterr().out


def test_cli_reports_bad_values_without_a_traceback(capsys):
    assert main(["train", "grpo", "--steps", "ten"]) == 2
    assert "--steps: expected an integer" in capsys.readouterr().err
    assert main(["train", "grpo", "--group_size", "1"]) == 2
    assert "group_size=1" in capsys.readouterr().err
    assert main(["train", "grpo", "--num_minibatches", "3"]) == 2
    assert "must divide" in capsys.readouterr().err


def test_presets_command_lists_sources(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert "grpo" in out and "arXiv:2402.03300" in out and "dr_grpo" in out


def test_pipeline_rejects_stage_options_it_owns(tmp_path, capsys):
    assert main(["pipeline", "--cpt.model", "small"]) == 2
    assert "the pipeline sets each stage's model" in capsys.readouterr().err
    f = tmp_path / "p.yaml"
    f.write_text("rl_stage:\n  seed: 3\n")
    assert main(["pipeline", "--config", str(f)]) == 2
    assert f"{f}: line 2: rl_stage.seed: the pipeline sets each stage's seed" in capsys.readouterr().err
    assert main(["pipeline", "--rl_stage.overwrite", "false"]) == 2  # the pipeline resumes or starts its stages
    assert "rl_stage.overwrite: the pipeline resumes or starts its stages itself; `lmpo pipeline --resume DIR` " \
           "continues an interrupted pipeline" in capsys.readouterr().err


def test_missing_model_directory_is_a_clear_error(tmp_path, capsys):
    assert main(["train", "grpo", "--model", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
