"""A misspelt name chosen from a list gets the nearest one, from one matcher (`lmpo.names`), in
both languages: argparse said `invalid choice: 'trian' (choose from ...)` for a command, stage or
action, and an unknown task, RL or model preset, preference loss or last stage listed the names
without the one meant."""

from __future__ import annotations

import pytest

from lmpo.cli.main import main
from lmpo.names import closest, did_you_mean


def _usage_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize(("argv", "expected"), [
    (["trian"], "lmpo: error: argument COMMAND: invalid choice: 'trian' (did you mean 'train'?) (choose from "
                "'pipeline', 'train', "),
    (["train", "dop"], "lmpo train: error: argument STAGE: invalid choice: 'dop' (did you mean 'dpo'?) (choose from "),
    (["exercise", "chek", "x.py"], "lmpo exercise: error: argument ACTION: invalid choice: 'chek' (did you mean "
                                   "'check'?) (choose from 'list', "),
    (["train", "rl", "--preset", "grop"], "argument --preset: invalid choice: 'grop' (did you mean 'grpo'?) (choose"),
    (["explain", "--lang", "zz"], "argument --lang: invalid choice: 'zz' (choose from 'en', 'zh')"),  # none near
])
def test_argparse_choices_get_the_nearest(argv, expected, capsys):
    assert expected in _usage_error(argv, capsys)


@pytest.mark.parametrize(("argv", "expected"), [
    (["trian", "--lang", "zh"], "lmpo：错误：参数 COMMAND：'trian' 不是可选的值（是不是 'train'？）；可选：'pipeline', "),
    (["explain", "grpo", "--lang", "zh", "--lang", "zz"], "lmpo explain：错误：参数 --lang：'zz' 不是可选的值；可选："),
])
def test_argparse_choices_in_chinese(argv, expected, capsys):
    assert _usage_error(argv, capsys).startswith(expected)


@pytest.mark.parametrize(("argv", "expected"), [
    (["presets", "--show", "grop"], "lmpo: error: unknown RL preset 'grop' (did you mean 'grpo'?); choose one of: "),
    (["train", "sft", "--task", "sort_digit", "--threads", "1"], "lmpo: error: unknown task 'sort_digit' (did you mean "
                                                   "'sort_digits'?); choose one of: "),
    (["train", "dpo", "--loss", "dop", "--threads", "1"], "loss='dop' (did you mean 'dpo'?) is not one of aot, "),
    (["pipeline", "--rl", "grop", "--threads", "1"], "unknown last stage --rl 'grop' (did you mean 'grpo'?); "),
    (["train", "grpo", "--model", "tiyn", "--threads", "1"], "model 'tiyn' (did you mean 'tiny'?) is not a local "),
    (["compare", "--methods", "dpo:ipoo"], "loss 'ipoo' (did you mean 'ipo'?) is not one of aot, aot_pair, "),
    (["compare", "--methods", "dpo:ipoo", "--lang", "zh"], "损失 'ipoo'（是不是 'ipo'？） 不在可选的损失之中；可选：aot, "),
])
def test_names_from_a_list_get_the_nearest(argv, expected, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(argv) == 2
    assert expected in capsys.readouterr().err


def test_the_registry_says_the_nearest_too():
    from lmpo.algos import KL_ESTIMATORS

    with pytest.raises(ValueError, match=r"unknown KL estimator 'k11' \(did you mean 'k1'\?\); choose one of: k1, "):
        KL_ESTIMATORS.get("k11")


def test_one_matcher():
    assert closest("GRPO", ["grpo", "dpo"]) == "grpo" and closest("dr-grpo", ["dr_grpo"]) == "dr_grpo"
    assert did_you_mean("xyz", ["grpo"]) == ""
    assert did_you_mean("tiyn", ["tiny", "small"]) == " (did you mean 'tiny'?)"
