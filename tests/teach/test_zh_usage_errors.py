"""A teaching command given `--lang zh` says argparse's own error line in Chinese too (it said
`lmpo explain: error: unrecognized arguments: --bogus`); the usage above it stays English, as
--help does, and without --lang zh (or on a command that takes no --lang) nothing changes."""

from __future__ import annotations

import pytest

from lmpo.cli.main import main

ZH = [
    (["explain", "grpo", "--otu", "x"], "lmpo explain：错误：无法识别的参数：--otu x（--otu：是不是 --out？）"),
    (["exercise", "start"], "lmpo exercise start：错误：缺少必需的参数：name"),
    (["exercise", "train", "x.py", "--steps", "abc"], "lmpo exercise train：错误：参数 --steps：'abc' 不是整数"),
    (["factcheck", "--out"], "lmpo factcheck：错误：参数 --out 后面要给一个值"),
    (["factcheck", "--fast=1"], "lmpo factcheck：错误：参数 --fast 不带值（给出的是 '1'）"),
    (["exercise", "chek", "mine.py"],  # its actions take --lang: it is a teaching command
     "lmpo exercise：错误：参数 ACTION：'chek' 不是可选的值（是不是 'check'？）；可选：'list', 'start', 'check', 'train'"),
]


def _last_line(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: lmpo ")
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(("argv", "line"), ZH, ids=[" ".join(argv[:2]) for argv, _ in ZH])
@pytest.mark.parametrize("spelling", [["--lang", "zh"], ["--lang=zh"]])
def test_usage_errors_in_chinese(argv, line, spelling, capsys):
    assert _last_line([*argv[:1], *spelling, *argv[1:]] if argv[0] == "factcheck" else [*argv, *spelling],
                      capsys) == line


def test_usage_errors_in_english_as_before(capsys):
    assert _last_line(["explain", "grpo", "--otu", "x"], capsys) == (
        "lmpo explain: error: unrecognized arguments: --otu x (--otu: did you mean --out?)")
    assert _last_line(["explain", "grpo", "--lang", "fr"], capsys) == (
        "lmpo explain: error: argument --lang: invalid choice: 'fr' (choose from 'en', 'zh')")
    assert _last_line(["presets", "--lang", "zh"], capsys) == "lmpo presets: error: unrecognized arguments: --lang zh"
