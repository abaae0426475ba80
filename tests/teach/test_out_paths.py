"""A bad --out is refused before any work, in one line with exit 2 naming what is wrong: `explain
grpo --out FILE` rendered the whole page, then failed with exit 1; `--out /proc/x` gave raw errno
text; `exercise start gae --out DIR --force` failed with "Is a directory" (exit 1) and without
--force suggested --force; `--out newdir/` wrote a file named newdir."""

from __future__ import annotations

import pytest

from lmpo.cli.main import main


def _one_line_error(capsys, prefix: str = "lmpo: error: ") -> tuple[str, str]:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), captured.err
    return captured.out, lines[0]


def test_explain_out_a_file_is_refused_before_the_page_is_rendered(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    assert main(["explain", "grpo", "--out", str(afile)]) == 2
    out, err = _one_line_error(capsys)
    assert out == "" and f"--out {afile}: is a file; give a directory" in err
    assert afile.read_text() == "mine"
    assert main(["explain", "grpo", "--out", str(afile / "pages")]) == 2
    assert f"{afile} is a file" in _one_line_error(capsys)[1]


def test_explain_out_that_cannot_be_made_says_so(capsys):
    assert main(["explain", "grpo", "--out", "/proc/lmpo-no-such/x"]) == 2
    err = _one_line_error(capsys)[1]
    assert "--out /proc/lmpo-no-such/x: cannot make this directory" in err and "[Errno" not in err


def test_explain_all_docs_into_a_file_is_refused(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    assert main(["explain", "--all", "--docs", str(afile)]) == 2
    assert f"--docs {afile}: is a file" in _one_line_error(capsys)[1]


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_exercise_start_into_a_directory_names_a_file_to_give(tmp_path, capsys, force):
    realdir = tmp_path / "realdir"
    realdir.mkdir()
    assert main(["exercise", "start", "gae", "--out", str(realdir), *force]) == 2
    err = _one_line_error(capsys)[1]
    assert f"--out {realdir}: names a directory; give the starter's file name, e.g. {realdir / 'gae.py'}" in err
    assert "--force" not in err and list(realdir.iterdir()) == []


def test_exercise_start_with_a_trailing_slash_writes_no_file(tmp_path, capsys):
    target = f"{tmp_path / 'newdir'}/"
    assert main(["exercise", "start", "gae", "--out", target]) == 2
    assert f"--out {target}: names a directory" in _one_line_error(capsys)[1]
    assert not (tmp_path / "newdir").exists()


def test_exercise_start_under_a_file_and_in_chinese(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    assert main(["exercise", "start", "gae", "--out", str(afile / "gae.py"), "--lang", "zh"]) == 2
    assert f"{afile} 是文件而不是目录" in _one_line_error(capsys, "lmpo：错误：")[1]
    realdir = tmp_path / "d"
    realdir.mkdir()
    assert main(["exercise", "start", "gae", "--out", str(realdir), "--lang", "zh"]) == 2
    assert "指向的是目录" in _one_line_error(capsys, "lmpo：错误：")[1]


def test_exercise_start_still_writes_and_refuses_to_overwrite(tmp_path, capsys):
    path = tmp_path / "gae.py"
    assert main(["exercise", "start", "gae", "--out", str(path)]) == 0
    assert path.read_text().startswith("# lmpo exercise: gae")
    path.write_text("my code")
    assert main(["exercise", "start", "gae", "--out", str(path)]) == 2
    assert "pass --force" in capsys.readouterr().err and path.read_text() == "my code"
    assert main(["exercise", "start", "gae", "--out", str(path), "--force"]) == 0
    assert path.read_text().startswith("# lmpo exercise: gae")


def _nothing_trains(monkeypatch) -> None:
    def trained(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr("lmpo.teach.exercise.check_file", trained)
    monkeypatch.setattr("lmpo.teach.exercise.train.train_exercise", trained)
    monkeypatch.setattr("lmpo.teach.compare.start_model", trained)


SOLUTION = "tests/teach/exercise_solutions/grpo_advantages_correct.py"


@pytest.mark.parametrize("lang, said", [("en", "{out}: is a file; give a directory"), ("zh", "{out}：这是一个文件；请给出目录")])
def test_exercise_train_out_a_file_is_refused_before_the_check_and_training(tmp_path, capsys, monkeypatch, lang, said):
    _nothing_trains(monkeypatch)
    afile = tmp_path / "afile"
    afile.write_text("mine")
    prefix = {"en": "lmpo: error: ", "zh": "lmpo：错误："}[lang]
    assert main(["exercise", "train", SOLUTION, "--out", str(afile), "--lang", lang]) == 2
    out, err = _one_line_error(capsys, prefix)
    assert out == "" and said.format(out=afile) in err and afile.read_text() == "mine"
    assert main(["exercise", "train", SOLUTION, "--out", str(afile / "runs"), "--lang", lang]) == 2
    assert str(afile) in _one_line_error(capsys, prefix)[1]


def test_compare_out_a_file_is_refused_in_the_words_of_explain_before_any_run(tmp_path, capsys, monkeypatch):
    _nothing_trains(monkeypatch)
    afile = tmp_path / "afile"
    afile.write_text("mine")
    argv = ["compare", "--methods", "grpo", "--seeds", "0", "--samples", "100", "--threads", "1"]
    assert main([*argv, "--out", str(afile)]) == 2
    assert f"--out {afile}: is a file; give a directory" in _one_line_error(capsys)[1]
    assert main([*argv, "--out", str(afile / "x")]) == 2
    assert f"--out {afile / 'x'}: {afile} is a file, so no directory can be made under it" in _one_line_error(capsys)[1]
