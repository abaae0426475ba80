"""`lmpo exercise check notes.txt --name gae` printed a check report blaming the user's code
("your code raised ExerciseFileError: notes.txt: not a Python file", at a line of lmpo's own
check.py) with exit 1; without --name it said "cannot tell which exercise it is". A file Python
cannot import is now refused in one line (exit 2) before any check, in the command's language."""

from __future__ import annotations

import pytest

from lmpo.cli.main import main


@pytest.mark.parametrize("action", [["check"], ["train", "--steps", "1"]])
@pytest.mark.parametrize(("lang", "line"), [("en", "lmpo: error: {path}: not a Python file"),
                                            ("zh", "lmpo：错误：{path}：不是 Python 文件")])
@pytest.mark.parametrize("name", [["--name", "gae"], []])
def test_a_file_python_cannot_import_is_refused_in_one_line(tmp_path, capsys, action, lang, line, name):
    path = tmp_path / "notes.txt"
    path.write_text("def gae(rewards, values, mask, gamma, lam):\n    return rewards\n")
    assert main(["exercise", action[0], str(path), *action[1:], *name, "--lang", lang]) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", line.format(path=path) + "\n")


@pytest.mark.parametrize(("lang", "line"), [
    ("en", "lmpo: error: {path}: not UTF-8 text (byte 0xff at offset 7); save it as UTF-8"),
    ("zh", "lmpo：错误：{path}：不是 UTF-8 文本（偏移 7 处的字节 0xff）；请以 UTF-8 编码保存")])
@pytest.mark.parametrize("action", ["check", "train"])
def test_a_file_not_in_utf8_is_named(tmp_path, capsys, lang, line, action):
    """It said only "lmpo: error: 'utf-8' codec can't decode byte 0xff in position 7: invalid start byte"."""
    path = tmp_path / "mine.py"
    path.write_bytes(b"# caf\xc3\xa9\xff\ndef gae(): ...\n")
    assert main(["exercise", action, str(path), "--lang", lang]) == 2
    assert capsys.readouterr().err == line.format(path=path) + "\n"
