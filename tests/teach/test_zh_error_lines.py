"""In Chinese mode the whole error line is Chinese: the `lmpo: error:` prefix was English (and so
was an operating-system error, `[Errno 13] Permission denied: ...`), while the refusal after it
was Chinese. English mode's lines are unchanged."""

from __future__ import annotations

import errno
import warnings

import pytest

import lmpo
from lmpo.cli.main import main


def _denied(*args, **kwargs):
    raise PermissionError(errno.EACCES, "Permission denied", "/srv/class/gae.py")


@pytest.mark.parametrize(("lang", "line", "code"), [
    ("zh", "lmpo：错误：/srv/class/gae.py：没有权限（系统的说明：Permission denied）", 1),
    ("en", "lmpo: error: cannot write /srv/class/gae.py: permission denied", 1),
])
def test_an_os_error_is_said_in_the_commands_language(monkeypatch, tmp_path, capsys, lang, line, code):
    monkeypatch.setattr("lmpo.teach.exercise.write_starter", _denied)
    assert main(["exercise", "start", "gae", "--out", str(tmp_path / "gae.py"), "--lang", lang]) == code
    assert capsys.readouterr().err == line + "\n"


def test_a_missing_file_from_the_os_is_said_in_chinese(monkeypatch, tmp_path, capsys):
    def missing(*args, **kwargs):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/srv/class/gae.py")

    monkeypatch.setattr("lmpo.teach.exercise.write_starter", missing)
    assert main(["exercise", "start", "gae", "--out", str(tmp_path / "gae.py"), "--lang", "zh"]) == 2
    assert capsys.readouterr().err == "lmpo：错误：/srv/class/gae.py：文件或目录不存在（系统的说明：No such file or directory）\n"
    assert main(["exercise", "start", "gae", "--out", str(tmp_path / "gae.py")]) == 2  # English as it was
    assert capsys.readouterr().err == "lmpo: error: [Errno 2] No such file or directory: '/srv/class/gae.py'\n"


def test_a_starters_lang_line_makes_the_prefix_chinese(tmp_path, capsys):
    """`exercise train FILE` with no --lang answers in the file's `# lang: zh`: its refusal too."""
    path = tmp_path / "mine.py"
    path.write_text("# lmpo exercise: gae\n# lang: zh\ndef gae(): ...\n")
    assert main(["exercise", "train", str(path), "--steps", "0"]) == 2
    assert capsys.readouterr().err == "lmpo：错误：--steps 必须 >= 1，而给出的是 0\n"
    path.write_text("# lmpo exercise: gae\ndef gae(): ...\n")
    assert main(["exercise", "train", str(path), "--steps", "0"]) == 2
    assert capsys.readouterr().err == "lmpo: error: --steps must be >= 1, got 0\n"


@pytest.mark.parametrize(("lang", "prefix"), [("zh", "lmpo：警告："), ("en", "lmpo: warning: ")])
def test_an_lmpo_warning_and_an_interrupt_in_the_commands_language(monkeypatch, capsys, lang, prefix):
    def warn_then_interrupt(args, flags):
        warnings.warn_explicit("metrics.jsonl: line 3 is cut short", UserWarning, filename=lmpo.__file__, lineno=1)
        raise KeyboardInterrupt

    monkeypatch.setattr("lmpo.cli.explain.cmd_explain", warn_then_interrupt)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(["explain", "grpo", "--lang", lang]) == 130
    said = {"zh": "lmpo：已中断", "en": "lmpo: interrupted"}[lang]
    assert capsys.readouterr().err == f"{prefix}metrics.jsonl: line 3 is cut short\n{said}\n"


@pytest.mark.parametrize(("lang", "line"), [("zh", "页面：{page}"), ("en", "page: {page}")])
def test_explain_names_its_page_in_the_commands_language(tmp_path, capsys, lang, line):
    """`lmpo explain kl --lang zh` ended its Chinese walk-through with an English `page: ...`."""
    assert main(["explain", "kl", "--lang", lang, "--out", str(tmp_path)]) == 0
    page = tmp_path / ("kl.zh.html" if lang == "zh" else "kl.html")
    assert capsys.readouterr().out.strip().splitlines()[-1] == line.format(page=page)


@pytest.mark.parametrize(("lang", "line"), [("zh", "在 {dir} 下写了 {n} 个文件"), ("en", "wrote {n} files under {dir}")])
def test_explain_docs_says_what_it_wrote_in_the_commands_language(tmp_path, capsys, monkeypatch, lang, line):
    monkeypatch.setattr("lmpo.teach.explain.docs.write_docs", lambda out: [tmp_path / "a.md", tmp_path / "b.md"])
    assert main(["explain", "--all", "--docs", str(tmp_path), "--lang", lang]) == 0
    assert capsys.readouterr().out == line.format(dir=tmp_path, n=2) + "\n"
