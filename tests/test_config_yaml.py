"""`--config FILE`: how YAML values reach the options, and the errors a file can earn (each one line,
naming the file and the line), for `build` and for `lmpo pipeline --config` (`pipeline_options`)."""

from dataclasses import dataclass, field
from typing import Literal

import pytest

from lmpo.cli.config import ConfigError, build, read_yaml
from lmpo.cli.main import main
from lmpo.cli.pipeline import pipeline_options


@dataclass
class Inner:
    steps: int = 3
    """How many steps."""
    tag: str = "t"
    """A text option of the section."""


@dataclass
class Outer:
    lr: float = 0.1
    """Learning rate."""
    name: str = "x"
    """A name."""
    mode: Literal["a", "b"] = "a"
    """Which mode."""
    flag: bool = False
    """A switch."""
    inner: Inner = field(default_factory=Inner)
    """A section."""


def _yaml(tmp_path, text: str) -> str:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    return str(f)


# 1. a text option takes an unquoted value as written


@pytest.mark.parametrize("written", ["2024_01", "1.10", "12:30", "0777", "1e-5", "0x1F", "yes", "1_000.5", ".inf"])
def test_a_text_option_takes_an_unquoted_yaml_value_as_written(tmp_path, written):
    """YAML would read `2024_01` as 202401, `1.10` as 1.1, `12:30` as 750 (base 60), `0777` as 511."""
    cfg = build(Outer, yaml_file=_yaml(tmp_path, f"name: {written}\ninner:\n  tag: {written}\n"))
    assert (cfg.name, cfg.inner.tag) == (written, written)


def test_numbers_and_switches_still_parse_and_null_is_still_refused_for_text(tmp_path):
    cfg = build(Outer, yaml_file=_yaml(tmp_path, "lr: 1e-5\ninner:\n  steps: 1_000\nflag: yes\nmode: b\n"))
    assert (cfg.lr, cfg.inner.steps, cfg.flag, cfg.mode) == (1e-5, 1000, True, "b")
    assert build(Outer, yaml_file=_yaml(tmp_path, "name: '007'\n")).name == "007"  # quoted: as before
    assert build(Outer, yaml_file=_yaml(tmp_path, "name: {a: 1.10}\n")).name == '{"a": 1.1}'  # JSON: as before
    with pytest.raises(ConfigError, match=r"line 1: name: expected a string, got null \(leave the option out for its "
                                          r"default\)$"):  # was "got None", Python's word, not YAML's
        build(Outer, yaml_file=_yaml(tmp_path, "name:\n"))
    with pytest.raises(ConfigError, match="line 1: lr: expected a number, got true$"):
        build(Outer, yaml_file=_yaml(tmp_path, "lr: yes\n"))


def test_train_and_pipeline_configs_keep_the_text_of_paths_and_names(tmp_path):
    from lmpo.trainers.supervised import SFTConfig

    f = _yaml(tmp_path, "out: 2024_01\nmodel: 1.10\neval_prompts: 12:30\nlr: 1e-5\n")
    cfg = build(SFTConfig, preset={"lr": 1e-4}, yaml_file=f, flags={})  # as `lmpo train sft --config` does
    assert (cfg.out, cfg.model, cfg.eval_prompts, cfg.lr) == ("2024_01", "1.10", "12:30", 1e-5)
    cfg, explicit = pipeline_options(_yaml(tmp_path, "out: 0777\ncpt:\n  eval_prompts: 12:30\n"), {})
    assert (cfg.out, cfg.cpt.eval_prompts) == ("0777", "12:30") and explicit == {"out", "cpt.eval_prompts"}


# 2. what YAML cannot build is an error naming the file and the line, not a traceback


@pytest.mark.parametrize("text,match", [
    ("lr: !custom 1\n", r"c.yaml: line 1, column 5: lr: could not determine a constructor for the tag '!custom'"),
    ("inner:\n  steps: !!python/object:os.system 1\n",
     r"c.yaml: line 2, column 10: inner.steps: could not determine a constructor for the tag .*python/object"),
    ("name: [1, !custom 2]\n", r"line 1, column 11: name: could not determine a constructor"),
    ("? [a, b]\n: 1\n", r"c.yaml: line 1: a key must be an option name, not a list"),
    ("inner:\n  ? {a: 1}\n  : 2\n", r"c.yaml: line 2: inner: a key must be an option name, not a mapping"),
    ("name: {[a]: 1}\n", r"c.yaml: line 1: name: a key must be an option name, not a list"),
    ("name: [{[a]: 1}]\n", r"c.yaml: line 1, column 9: name: found unhashable key"),
    ("inner: &x\n  steps: *x\n", r"c.yaml: line 2: inner.steps: an alias to a mapping that contains it"),
    ("name: &x [*x]\n", r"c.yaml: line 1, column 7: name: found unconstructable recursive node"),
    ("name: {d: 2024-01-01}\n", r"c.yaml: line 1: name: cannot be given as JSON text"),
])
def test_yaml_that_cannot_be_built_is_a_one_line_error(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match) as info:
        build(Outer, yaml_file=_yaml(tmp_path, text))
    assert "\n" not in str(info.value) and "<unicode string>" not in str(info.value)


def test_pipeline_config_with_a_tag_or_a_complex_key_is_refused_without_a_traceback(tmp_path, capsys):
    for text in ("cpt:\n  lr: !!python/object:os.system 1\n", "? [a, b]\n: 1\n"):
        assert main(["pipeline", "--config", _yaml(tmp_path, text)]) == 2
        err = capsys.readouterr().err
        assert "c.yaml: line" in err and "Traceback" not in err


# 3. an option given both as a dotted key and in its section


@pytest.mark.parametrize("text,line,first", [("inner.steps: 7\ninner:\n  steps: 2\n", 3, 1),
                                             ("inner:\n  steps: 2\nlr: 1\ninner.steps: 7\n", 4, 2)])
def test_an_option_given_dotted_and_in_its_section_is_refused(tmp_path, text, line, first):
    with pytest.raises(ConfigError, match=rf"c.yaml: line {line}: inner.steps: given twice \(first on line {first}"):
        build(Outer, yaml_file=_yaml(tmp_path, text))


def test_dotted_keys_and_sections_that_do_not_overlap_are_merged(tmp_path):
    cfg = build(Outer, yaml_file=_yaml(tmp_path, "inner.tag: d\ninner:\n  steps: 2\n"))
    assert (cfg.inner.tag, cfg.inner.steps) == ("d", 2)
    assert read_yaml(_yaml(tmp_path, "inner.tag: d\ninner:\n  steps: 2\n"))[1] == {
        "inner.tag": 1, "inner": 2, "inner.steps": 3}


def test_pipeline_stage_option_given_twice_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"c.yaml: line 3: cpt.steps: given twice \(first on line 1"):
        pipeline_options(_yaml(tmp_path, "cpt.steps: 7\ncpt:\n  steps: 2\n"), {})


# 4. messages that say what is wrong


@pytest.mark.parametrize("text,got", [("inner: 5\n", "got 5"), ("inner:\n", "it is empty"),
                                      ("inner: [1]\n", r"got \[1\]")])
def test_a_section_given_a_value_says_it_takes_a_mapping(tmp_path, text, got):
    with pytest.raises(ConfigError, match=rf"c.yaml: line 1: inner: a section, not an option: it must be a mapping "
                                          rf"of the section's options .*; {got}$"):
        build(Outer, yaml_file=_yaml(tmp_path, text))


@pytest.mark.parametrize("text", ["cpt: 5\n", "cpt:\n", "rl_stage: fast\n"])
def test_a_pipeline_section_given_a_value_is_not_called_an_unknown_option(tmp_path, text):
    with pytest.raises(ConfigError, match=r"a section, not an option: it must be a mapping") as info:
        pipeline_options(_yaml(tmp_path, text), {})
    assert "unknown option" not in str(info.value)


def test_a_directory_given_as_config_file_is_named_as_such(tmp_path, capsys):
    with pytest.raises(ConfigError, match=rf"config file {tmp_path} is a directory, not a file"):
        build(Outer, yaml_file=str(tmp_path))
    assert main(["pipeline", "--config", str(tmp_path)]) == 2
    assert "is a directory, not a file" in capsys.readouterr().err


def test_a_config_file_that_is_no_regular_file_is_not_said_to_be_missing(tmp_path, capsys):
    """`lmpo train ppo --config /dev/null` said "config file /dev/null does not exist"."""
    import os

    with pytest.raises(ConfigError, match=r"^config file /dev/null is a character device, not a YAML file of "
                                          r"options \(for no options from a file, leave --config out\)$"):
        build(Outer, yaml_file="/dev/null")
    os.mkfifo(tmp_path / "fifo")
    assert main(["train", "ppo", "--config", str(tmp_path / "fifo")]) == 2
    assert f"config file {tmp_path / 'fifo'} is a pipe, not a YAML file of options" in capsys.readouterr().err


def test_an_unreadable_config_file_is_a_one_line_error(tmp_path, monkeypatch):
    from pathlib import Path

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    f = _yaml(tmp_path, "lr: 1\n")
    monkeypatch.setattr(Path, "read_text", refuse)
    with pytest.raises(ConfigError, match=r"config file .*c.yaml: cannot be read \(Permission denied\)"):
        build(Outer, yaml_file=f)


def test_a_toml_config_file_is_refused_as_toml_and_a_json_one_is_read(tmp_path):
    """`--config c.toml` said "line 1: expected a mapping of option: value", not why."""
    toml = tmp_path / "c.toml"
    toml.write_text('name = "x"\nlr = 1\n')
    with pytest.raises(ConfigError, match=r"c\.toml: TOML is not supported; a config file is YAML \(or JSON, which "
                                          r"YAML reads\): write `key = value` as `key: value`"):
        build(Outer, yaml_file=str(toml))
    named_otherwise = tmp_path / "c.cfg"
    named_otherwise.write_text(toml.read_text())
    with pytest.raises(ConfigError, match=r"line 1: expected a mapping of option: value \(this reads as TOML's "):
        build(Outer, yaml_file=str(named_otherwise))
    json_file = tmp_path / "c.json"
    json_file.write_text('{"name": "x", "inner": {"steps": 3}}')
    cfg = build(Outer, yaml_file=str(json_file))
    assert (cfg.name, cfg.inner.steps) == ("x", 3)


def test_a_path_from_a_config_file_that_is_not_found_names_the_file_and_line(tmp_path, monkeypatch, capsys):
    """"model directory ../m_llama does not exist" did not say the value came from a config file."""
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "rel.yaml").write_text("epochs: 1\nmodel: ../m_llama\n")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "sft", "--config", "cfg/rel.yaml", "--threads", "1", "--out", "run"]) == 2
    assert capsys.readouterr().err == (
        f"lmpo: error: model directory ../m_llama does not exist (presets: tiny, small) (../m_llama: from "
        f"cfg/rel.yaml: line 2: model; read from the current directory, {tmp_path})\n")
    assert main(["train", "sft", "--model", "../m_llama", "--threads", "1", "--out", "run"]) == 2
    assert capsys.readouterr().err.endswith("(presets: tiny, small)\n")  # a flag's: nothing to add
