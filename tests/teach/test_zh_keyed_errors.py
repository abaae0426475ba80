"""Under Chinese the errors raised below the teaching layer are Chinese too, their English
unchanged: a --start or --model that is not a model (check_model_source), a run directory another
run holds, and the usage errors of an exercise file that says `# lang: zh` or a compare --config
that says `lang: zh` were said in English after `lmpo：错误：` (or with no Chinese at all)."""

from __future__ import annotations

import fcntl
import json
import os

import pytest

from lmpo.cli.main import main


def _err(argv, capsys, code=2) -> str:
    assert main(argv) == code
    return capsys.readouterr().err.strip()


@pytest.mark.parametrize(("argv", "zh", "en"), [
    (["compare", "--start", "DIR"], "lmpo：错误：--start：DIR 不是 Hugging Face 模型目录：里面没有 config.json",
     "lmpo: error: --start: DIR is not a Hugging Face model directory: it has no config.json"),
    (["compare", "--model", "DIR/weights.bin"], "lmpo：错误：DIR/weights.bin 是文件；模型要以它所在的目录给出",
     "lmpo: error: DIR/weights.bin is a file; a model is given as its directory"),
    (["compare", "--model", "./no_such_model"], "lmpo：错误：模型目录 no_such_model 不存在（预设：tiny, small）",
     "lmpo: error: model directory no_such_model does not exist (presets: tiny, small)"),
])
def test_a_model_that_is_not_one_is_said_in_chinese(argv, zh, en, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "weights.bin").write_bytes(b"")
    argv = [a.replace("DIR", str(tmp_path / "dir")) for a in argv] + ["--out", str(tmp_path / "out")]
    assert _err([*argv, "--lang", "zh"], capsys) == zh.replace("DIR", str(tmp_path / "dir"))
    assert _err(argv, capsys) == en.replace("DIR", str(tmp_path / "dir"))  # the English as it was


def test_a_hub_id_not_cached_offline_is_said_in_chinese(tmp_path, monkeypatch, capsys):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr("lmpo.models.hub.went_offline", "")
    err = _err(["compare", "--model", "tiyn", "--out", str(tmp_path / "out"), "--lang", "zh"], capsys)
    assert err.startswith("lmpo：错误：模型 'tiyn'（是不是 'tiny'？） 既不是本地目录也不是预设（tiny, small）")
    assert err.endswith("而设置了 HF_HUB_OFFLINE。请检查名字，或者给出用 save_pretrained 保存的目录")


def test_a_run_directory_in_use_is_said_in_chinese(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out / ".lock", os.O_RDWR | os.O_CREAT)  # another run's lock, as a second process holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps({"pid": 4321, "argv": ["lmpo", "compare"], "started": "T"}).encode())
        held_by = "process 4321 (`lmpo compare`, started T)"
        assert _err(["compare", "--out", str(out), "--lang", "zh"], capsys) == (
            f"lmpo：错误：--out {out}：这个运行目录正被 {held_by} 使用；请等它结束，或者换一个 --out")
        assert _err(["compare", "--out", str(out)], capsys) == (
            f"lmpo: error: --out {out}: the run directory is in use by {held_by}; wait for it to end, or choose "
            f"another --out")
    finally:
        os.close(fd)


def _usage_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_an_exercise_file_in_chinese_makes_its_usage_errors_chinese(tmp_path, capsys):
    mine = tmp_path / "mine.py"
    mine.write_text("# lmpo exercise: gae\n# lang: zh\ndef gae(): ...\n")
    assert _usage_error(["exercise", "train", str(mine), "--steps", "abc"], capsys) == (
        "lmpo exercise train：错误：参数 --steps：'abc' 不是整数")
    assert _usage_error(["exercise", "check", str(mine), "--bogus"], capsys) == (
        "lmpo exercise check：错误：无法识别的参数：--bogus")
    assert _usage_error(["exercise", "check", str(mine), "--bogus", "--lang", "en"], capsys) == (
        "lmpo exercise check: error: unrecognized arguments: --bogus")  # --lang overrides the file


@pytest.mark.parametrize(("yaml", "zh"), [
    ("lang: zh\nthreads: abc\n", "lmpo：错误：CFG: line 2: threads：'abc' 不是整数"),
    ("lang: zh\nstepz: 1\n", "lmpo：错误：CFG: line 2: stepz：没有这个选项；可用的选项：budget, device, lang, "),
])
def test_a_compare_config_in_chinese_is_refused_in_chinese(yaml, zh, tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(yaml)
    assert _err(["compare", "--config", str(config)], capsys).startswith(zh.replace("CFG", str(config)))
    assert _err(["compare", "--config", str(config), "--lang", "en"], capsys).startswith(
        f"lmpo: error: {config}: line 2: ")
