"""With --lang zh (or a starter's `# lang: zh` line), the one-line refusals of explain, exercise and
factcheck are Chinese too; they were English while the rest of the output was Chinese."""

from __future__ import annotations

import pytest

from lmpo.cli.main import main


def _cjk(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


CASES = [
    (["explain", "grpoo"], ["没有名为 'grpoo' 的方法", "是不是 'grpo'"]),
    (["explain", "--docs", "d"], ["请同时加上 --all"]),
    (["explain", "grpo", "--list"], ["要求的是不同的事"]),
    (["explain", "grpo", "--out", "{afile}"], ["这是一个文件；请给出目录"]),
    (["explain", "grpo", "--out", "{afile}/x"], ["是文件，无法在它下面建目录"]),
    (["factcheck", "--only", "kl_estimator"], ["没有这些论断", "是不是 'kl_estimators'"]),
    (["factcheck", "--only", ","], ["没有给出任何论断"]),
    (["factcheck", "--only", "grpo_no_critic", "--fast"], ["没有选中任何论断"]),
    (["factcheck", "--fast", "--out", "{afile}"], ["这是一个文件"]),
    (["exercise", "start", "grpo_advantage"], ["没有名为 'grpo_advantage' 的练习", "是不是 'grpo_advantages'"]),
    (["exercise", "check", "{missing}"], ["文件不存在"]),
    (["exercise", "check", "{syntax}"], ["无法判断这是哪个练习", "--name"]),
    (["exercise", "check", "{dir}"], ["是目录"]),
    (["exercise", "train", "{missing}"], ["文件不存在"]),
    (["exercise", "train", "{syntax}", "--name", "gae", "--steps", "0"], ["--steps 必须 >= 1"]),
    (["exercise", "train", "{syntax}", "--name", "gae", "--out", "{afile}"], ["这是一个文件"]),
]
ENGLISH = ["unknown", "did you mean", "choose", "no such", "cannot", "is a file", "give a", "names no", "pass --name",
           "directory", "must be"]


@pytest.mark.parametrize("argv, words", CASES, ids=[" ".join(argv[:2]) + str(i) for i, (argv, _) in enumerate(CASES)])
def test_refusals_in_chinese(tmp_path, capsys, argv, words):
    afile, syntax = tmp_path / "afile", tmp_path / "syntax.py"
    afile.write_text("")
    syntax.write_text("def (\n")
    (tmp_path / "dir").mkdir()
    paths = {"afile": afile, "missing": tmp_path / "missing.py", "syntax": syntax, "dir": tmp_path / "dir"}
    argv = [a.format(**paths) for a in argv]
    assert main([*argv, "--lang", "zh"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lmpo：错误：") and captured.out == "", captured
    text = lines[0].removeprefix("lmpo：错误：")
    assert _cjk(text) and all(w in text for w in words), text
    assert not [w for w in ENGLISH if w in text], text


def test_the_same_refusals_stay_english_without_lang(tmp_path, capsys):
    assert main(["explain", "grpoo"]) == 2
    assert capsys.readouterr().err.startswith("lmpo: error: unknown method 'grpoo' (did you mean 'grpo'?); choose one of:")
    assert main(["exercise", "check", str(tmp_path / "missing.py")]) == 2
    assert capsys.readouterr().err == f"lmpo: error: {tmp_path / 'missing.py'}: no such file\n"
