"""The README's code runs: every Python block executes, every YAML block is a valid pipeline
configuration, and every `lmpo ...` command it shows is accepted by the command line. The Chinese
landing page (docs/zh/README.md) is held to the same: its commands parse, its links resolve."""

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

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
ZH_PAGE = ROOT / "docs" / "zh" / "README.md"
ZH = ZH_PAGE.read_text()
PLACEHOLDERS = {"--rl NAME": "--rl grpo", "--task NAME": "--task sort_digits", "--preset NAME": "--preset grpo"}
NUMBERS = {"N": "0", "S": "0", "K": "3"}


parser = functools.cache(make_parser)


def blocks(language: str, text: str = README) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def shown_commands(text: str = README) -> list[str]:
    """The page's concrete `lmpo` commands (in code spans and bash blocks); synopses with
    alternatives (`a|b`), optional parts (`[...]`) or elisions (`...`) are left out."""
    spans = re.findall(r"`(lmpo [^`]+)`", text)
    lines = [line.split("#")[0].strip() for block in blocks("bash", text) for line in block.splitlines()]
    found = spans + [line for line in lines if line.startswith("lmpo ")]
    return sorted({c for c in found if not re.search(r"[|\[]|\.\.\.|COMMAND", c)})


def concrete(command: str) -> list[str]:
    for placeholder, value in PLACEHOLDERS.items():
        command = command.replace(placeholder, value)
    return [NUMBERS.get(word, word) for word in shlex.split(command)[1:]]


def test_the_readme_shows_commands_and_code():
    assert len(shown_commands()) >= 20 and blocks("python") and blocks("yaml")


def assert_parses(command: str, page: str) -> None:
    """A command named in prose (`lmpo doctor`) must exist: its --help works; a full one must parse."""
    words = concrete(command)
    named_only = all(not w.startswith("-") and w.isidentifier() for w in words)
    try:
        parser().parse_args(words + ["--help"] if named_only else words)
    except SystemExit as stop:
        if not ((named_only or "--help" in words) and stop.code == 0):
            pytest.fail(f"{page} command `{command}` is rejected by the CLI (exit {stop.code})")


@pytest.mark.parametrize("command", shown_commands())
def test_every_command_the_readme_shows_parses(command):
    assert_parses(command, "README")


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


# --- the Chinese landing page ---------------------------------------------------------------------

def test_the_chinese_page_shows_commands_and_the_readme_links_to_it():
    assert len(shown_commands(ZH)) >= 20
    assert "](docs/zh/README.md)" in README


@pytest.mark.parametrize("command", shown_commands(ZH))
def test_every_command_the_chinese_page_shows_parses(command):
    assert_parses(command, "docs/zh/README.md")


def slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # a `# comment` in a code block is no heading
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_slug_is_githubs():
    assert slug("What `scripts/pipeline.sh` shows") == "what-scriptspipelinesh-shows"
    assert slug("GPUs, LoRA and several processes") == "gpus-lora-and-several-processes"


@pytest.mark.parametrize("page", [ZH_PAGE, ROOT / "README.md"], ids=["zh", "README"])
def test_relative_links_resolve(page):
    """Each relative link names a file that exists, and its #anchor a heading of that file."""
    targets = re.findall(r"\]\(([^)\s]+)\)", page.read_text())
    local = [t for t in targets if not re.match(r"[a-z]+:", t)]
    assert local
    for target in local:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.relative_to(ROOT)}: link {target} names no file"
        if anchor and file.suffix == ".md":
            assert anchor in anchors(file), f"{page.relative_to(ROOT)}: link {target}: no such heading in {file.relative_to(ROOT)}"


def test_the_chinese_page_leaves_measured_figures_to_the_readme():
    """Accuracies change with the code; the English README is where they are kept up to date."""
    assert not re.search(r"\d%", ZH), "docs/zh/README.md quotes a percentage: link to the README's table instead"


def test_the_chinese_page_uses_the_terms_of_lmpo_explain():
    """Its core terms are the glossary's of `lmpo explain --lang zh`, the English given at the first use."""
    from lmpo.teach.explain.text_zh import GLOSSARY

    terms = {**{t: GLOSSARY[t] for t in ("优势", "参考模型", "裁剪", "策略", "奖励模型", "聚合")},
             "词元": "token", "回答": "completion", "提示": "prompt", "判题器": "verifier", "留出集": "held-out"}
    for term, english in terms.items():
        first = ZH.index(term)
        assert ZH[first + len(term):].startswith(f"（{english}"), f"first {term!r} is not followed by （{english}）"
