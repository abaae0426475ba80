"""The README's code runs: every Python block executes, every YAML block is a valid pipeline
configuration, and every `lmpo ...` command it shows is accepted by the command line."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import functools
import json

import pytest

from lmpo.cli.config import build
from lmpo.cli.main import make_parser
from lmpo.trainers.pipeline import PipelineConfig

README = (Path(__file__).parent.parent / "README.md").read_text()
PLACEHOLDERS = {"--rl NAME": "--rl grpo", "--task NAME": "--task sort_digits", "--preset NAME": "--preset grpo"}
NUMBERS = {"N": "0", "S": "0", "K": "3"}


parser = functools.cache(make_parser)


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, re.S)


def shown_commands() -> list[str]:
    """The README's concrete `lmpo` commands (in code spans and bash blocks); synopses with
    alternatives (`a|b`), optional parts (`[...]`) or elisions (`...`) are left out."""
    spans = re.findall(r"`(lmpo [^`]+)`", README)
    lines = [line.split("#")[0].strip() for block in blocks("bash") for line in block.splitlines()]
    found = spans + [line for line in lines if line.startswith("lmpo ")]
    return sorted({c for c in found if not re.search(r"[|\[]|\.\.\.|COMMAND", c)})


def concrete(command: str) -> list[str]:
    for placeholder, value in PLACEHOLDERS.items():
        command = command.replace(placeholder, value)
    return [NUMBERS.get(word, word) for word in shlex.split(command)[1:]]


def test_the_readme_shows_commands_and_code():
    assert len(shown_commands()) >= 20 and blocks("python") and blocks("yaml")


@pytest.mark.parametrize("command", shown_commands())
def test_every_command_the_readme_shows_parses(command):
    """A command named in prose (`lmpo doctor`) must exist: its --help works; a full one must parse."""
    words = concrete(command)
    named_only = all(not w.startswith("-") and w.isidentifier() for w in words)
    try:
        parser().parse_args(words + ["--help"] if named_only else words)
    except SystemExit as stop:
        if not ((named_only or "--help" in words) and stop.code == 0):
            pytest.fail(f"README command `{command}` is rejected by the CLI (exit {stop.code})")


@pytest.mark.parametrize("index", range(len(blocks("yaml"))))
def test_every_yaml_block_is_a_pipeline_config(index, tmp_path):
    path = tmp_path / "my.yaml"
    path.write_text(blocks("yaml")[index])
    assert isinstance(build(PipelineConfig, yaml_file=str(path)), PipelineConfig)


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_every_python_block_runs(index, tmp_path, monkeypatch, capsys):
    """Each block runs on its own, in a fresh directory (the Python API block trains a smoke
    pipeline in seconds, with the grpo preset's β as on the command line)."""
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks("python")[index], f"README.md python block {index + 1}", "exec"), {})
    api_run = tmp_path / "runs" / "api"
    if api_run.is_dir():
        summary = json.loads((api_run / "summary.json").read_text())
        assert [s["name"] for s in summary["stages"]] == ["cpt", "sft", "grpo"]
        assert json.loads((api_run / "config.json").read_text())["rl_stage"]["beta"] == 0.04
