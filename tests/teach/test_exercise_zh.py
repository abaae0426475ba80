"""`lmpo exercise check` and `train` in Chinese: chosen by the starter's `# lang: zh` line or --lang."""

import re
from pathlib import Path

import pytest

from lmpo.cli.main import main
from lmpo.teach.exercise import EXERCISES, check_file, exercise_of_file, language_of_file, starter_text
from lmpo.teach.exercise.train import RunFigures, figures_table, verdict

SOLUTIONS = Path(__file__).parent / "exercise_solutions"

# planted mistake -> words its Chinese symptom must contain
PLANTED_ZH = {
    "grpo_advantages_population_std": ["N 而不是 N-1", "总体标准差", "1.155 倍"],
    "grpo_advantages_wrong_sign": ["优势的符号反了"],
    "grpo_advantages_no_eps": ["你漏掉了 eps", "(std + eps)"],
    "grpo_advantages_eps_on_variance": ["eps 加在了方差上而不是标准差上"],
    "grpo_advantages_naive_equal_group": ["奖励全部相等的组，优势却不为零"],
    "grpo_advantages_contiguous_groups": ["group id 可以是任意整数、任意顺序"],
    "grpo_advantages_batch_std": ["不是按组计算的", "整个批次的均值和标准差"],
    "grpo_advantages_no_detach": ["梯度流过了基线", "stop-gradient"],
    "rloo_advantages_includes_self": ["基线包含了回答自身", "0.75 倍"],
    "rloo_advantages_single_member": ["只有一个回答的组", "G−1 = 0"],
    "ppo_clip_loss_wrong_side": ["负优势时裁剪放错了一侧", "在比值 0.5、A=-1 处"],
    "ppo_clip_loss_wrong_sign": ["损失的符号反了"],
    "ppo_clip_loss_no_mask": ["padding 词元改变了损失", "没有应用掩码"],
    "ppo_clip_loss_mask_multiply": ["你的损失是 NaN", "torch.where"],
    "ppo_clip_loss_where_output": ["对损失用 torch.where 挡不住", "在 exp 之前", "对数比"],
    "ppo_clip_loss_no_detach": ["梯度流过了旧策略的 log 概率", "detach"],
    "aggregation_token_mean": ["词元均值而不是序列均值", "长序列权重更大"],
    "aggregation_unmasked": ["padding 词元改变了损失"],
    "aggregation_empty_rows": ["全是 padding 的行被算成了一个序列"],
    "gae_bootstrap_padding": ["padding 位置的价值做了自举"],
    "gae_discounted_returns": ["奖励的折扣和", "A + V"],
    "gae_walks_tool_tokens": ["被当成了时间步"],
    "k3_flipped": ["κ 的符号反了"],
    "k3_unclamped": ["没有对 κ 做截断"],
    "dpo_loss_swapped": ["弄反了", "h 的符号反了"],
    "dpo_loss_no_detach": ["梯度流过了参考模型的 log 概率", "stop-gradient"],
    "dpo_loss_log_sigmoid": ["会溢出", "logsigmoid"],
    "bradley_terry_loss_swapped": ["被选和被拒弄反了"],
    "bradley_terry_loss_margin_added": ["margin 被加上而不是减去"],
    "ppo_clip_loss_mutates_mask": ["原地修改了输入 `mask`"],
    "grpo_advantages_inplace_ids": ["原地修改了输入 `group_ids`"],
    "grpo_advantages_inplace_result": ["原地修改了输入 `rewards`"],
    "gae_off_by_one": ["错位了一个词元", "下一个损失词元"],
    "gae_gamma_lambda_swapped": ["δ 中的 γ 和 λ 弄反了", "λ·V_{t+1}"],
    "aggregation_wrong_axis": ["在错误的维度上取了平均", "dim 0"],
    "rloo_advantages_whole_sum": ["整组奖励之和（包括回答自身）除以了 G−1"],
    "dpo_loss_ref_added": ["被加上而不是减去", "对数比"],
}

# the English words of the report's frame: none may remain in a Chinese report
FRAME_EN = ["symptom:", "input:", "expected:", "got:", "first difference", "FAIL", "  ok  ", "checking",
            "agrees with", "pass:", "TODO", "ERROR", "not implemented", "your code raised", "  at ", "probe ",
            "gradient of", "your ", "exercise "]


def _cjk(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


def _check(stem: str, lang: str):
    path = SOLUTIONS / f"{stem}.py"
    return check_file(path, EXERCISES[exercise_of_file(path, EXERCISES)], lang=lang)


def test_every_exercise_has_a_planted_mistake_checked_in_chinese():
    assert {exercise_of_file(SOLUTIONS / f"{stem}.py", EXERCISES) for stem in PLANTED_ZH} == set(EXERCISES)


@pytest.mark.parametrize("stem", list(PLANTED_ZH))
def test_planted_mistake_in_chinese_names_its_symptom_in_chinese(stem):
    en, zh = _check(stem, "en"), _check(stem, "zh")
    assert zh.mismatch is not None and zh.mismatch.probe == en.mismatch.probe, zh.text()
    for word in PLANTED_ZH[stem]:
        assert word in zh.mismatch.symptom, zh.text()
    text = zh.text()
    assert "症状：" in text and "期望：" in text and "实际：" in text and f"  失败  {en.mismatch.probe}" in text
    for word in FRAME_EN:
        assert word not in text, (word, text)
    # the English report is the default, and has no Chinese in it
    assert en.text() == _check(stem, "en").text() and not _cjk(en.text())
    assert "symptom:  " + en.mismatch.symptom in en.text()


@pytest.mark.parametrize("name", list(EXERCISES))
def test_correct_solution_passes_in_chinese(name):
    text = _check(f"{name}_correct", "zh").text()
    assert f"练习 {name}：" in text and "通过：" in text and "在每一项检查上都与" in text
    assert "  通过  random" in text and "组大小各异的随机输入" in text
    for word in FRAME_EN:
        assert word not in text, (word, text)


def test_user_exception_in_chinese_keeps_the_file_and_line(capsys):
    assert main(["exercise", "check", str(SOLUTIONS / "grpo_advantages_raises.py"), "--lang", "zh"]) == 1
    out = capsys.readouterr().out
    assert "你的代码抛出了 IndexError" in out and "（检查项 worked_example，输入：ALGORITHMS.md 中的示例" in out
    assert "        位置：" in out and "grpo_advantages_raises.py:8: return centered[:, 0]" in out
    assert "your code raised" not in out and "        at " not in out


def test_the_starter_records_its_language_and_check_answers_in_it(tmp_path, capsys):
    zh, en = tmp_path / "zh.py", tmp_path / "en.py"
    assert main(["exercise", "start", "k3", "--out", str(zh), "--lang", "zh"]) == 0
    assert main(["exercise", "start", "k3", "--out", str(en)]) == 0
    assert "已写入" in capsys.readouterr().out
    assert zh.read_text().splitlines()[:2] == ["# lmpo exercise: k3", "# lang: zh"]
    assert "# lang:" not in en.read_text() and en.read_text() == starter_text(EXERCISES["k3"], "en", file=str(en))
    assert language_of_file(zh) == "zh" and language_of_file(en) == "en"
    assert exercise_of_file(zh, EXERCISES) == "k3"
    assert "k3 KL 估计量" in zh.read_text()  # the Chinese summary in the header

    # a wrong k3 (κ flipped) written into each file
    wrong = (SOLUTIONS / "k3_flipped.py").read_text()
    zh.write_text(zh.read_text().split("from __future__")[0] + wrong)
    en.write_text(wrong)
    assert main(["exercise", "check", str(zh)]) == 1
    out = capsys.readouterr().out
    assert "κ 的符号反了" in out and "symptom:" not in out
    assert main(["exercise", "check", str(zh), "--lang", "en"]) == 1
    assert "κ has the wrong sign" in capsys.readouterr().out
    assert main(["exercise", "check", str(en)]) == 1
    assert "κ has the wrong sign" in capsys.readouterr().out
    assert main(["exercise", "check", str(en), "--lang", "zh"]) == 1
    assert "κ 的符号反了" in capsys.readouterr().out


def test_the_language_line_is_read_from_the_header_only(tmp_path):
    f = tmp_path / "a.py"
    f.write_text("# lmpo exercise: k3\n\ndef k3(a, b):\n    # lang: zh\n    return a\n")
    assert language_of_file(f) == "en"


def test_a_language_lmpo_lacks_is_refused_with_its_line(tmp_path, capsys):
    f = tmp_path / "a.py"
    f.write_text("# lmpo exercise: k3\n# lang: fr\n")
    with pytest.raises(ValueError, match=r"a.py, line 2: `# lang: fr` names a language"):
        language_of_file(f)
    assert main(["exercise", "check", str(f)]) == 2
    assert "line 2: `# lang: fr`" in capsys.readouterr().err
    f.write_text("# lmpo exercise: k3\n# lang: zh-CN\n")
    with pytest.raises(ValueError, match="zh-CN"):
        language_of_file(f)


def test_list_in_chinese(capsys):
    assert main(["exercise", "list", "--lang", "zh"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(EXERCISES) and all(_cjk(line) for line in lines)
    assert any("GRPO 的组内归一化优势" in line for line in lines)


def test_every_exercise_text_exists_in_both_languages():
    for ex in EXERCISES.values():
        for text in (ex.summary, ex.plug.role):
            assert set(text) == {"en", "zh"} and _cjk(text["zh"]) and not _cjk(text["en"])
        for probe in ex.probes:
            if isinstance(probe.checks, dict):
                assert _cjk(probe.checks["zh"]) and not _cjk(probe.checks["en"])


def test_figures_and_verdicts_in_chinese():
    runs = [RunFigures("你的", 0.3, 0.5, 1.0, "runs/yours"), RunFigures("lmpo grpo", 0.3, 0.62, 2.0, "runs/lmpo")]
    table = figures_table(runs, "zh")
    assert table.splitlines()[0].split() == ["运行", "留出集准确率", "用时（秒）", "运行目录"]
    assert "30.0% → 50.0%" in table
    assert verdict(*runs, lang="zh") == ("你的：+20.0 个百分点，lmpo 的：+32.0 个百分点（不同；正确的函数会得到相同的训练结果，"
                                         "至多相差浮点舍入误差）。")
    assert verdict(runs[0], runs[0], lang="zh").startswith("你的实现在这里与 lmpo 的训练结果完全相同")
    assert "你的实现没有学到东西：-20.0 个百分点" in verdict(RunFigures("你的", 0.3, 0.1, 1.0, "y"), runs[1], lang="zh")


def test_train_in_chinese_after_a_failed_check(tmp_path, monkeypatch, capsys):
    """The CLI's own lines in Chinese (training itself replaced by fixed figures: this is about the words)."""
    import lmpo.teach.exercise.train as train

    path = tmp_path / "mine.py"
    path.write_text("# lmpo exercise: grpo_advantages\n# lang: zh\n"
                    + (SOLUTIONS / "grpo_advantages_wrong_sign.py").read_text())
    same = [RunFigures("你的", 0.3, 0.3, 1.0, "y"), RunFigures("lmpo grpo", 0.3, 0.3, 1.0, "l")]
    monkeypatch.setattr(train, "train_exercise", lambda *a, **k: same)
    assert main(["exercise", "train", str(path), "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "检查：在 worked_example 处失败：优势的符号反了" in out and "仍然继续训练" in out
    assert "你的实现在这里与 lmpo 的训练结果完全相同" in out and "你的函数没有通过上面的检查" in out
    for word in ("check:", "training anyway", "yours", "held-out", "your function"):
        assert word not in out, (word, out)

    def broken(*args, **kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(train, "train_exercise", broken)
    assert main(["exercise", "train", str(path), "--steps", "2"]) == 1
    assert "用你的函数训练时中断：RuntimeError: shape mismatch" in capsys.readouterr().out
    assert main(["exercise", "train", str(path), "--steps", "2", "--lang", "en"]) == 1
    assert "training with your function stopped: RuntimeError: shape mismatch" in capsys.readouterr().out


def test_train_exercise_says_what_it_does_in_chinese(tmp_path, capsys):
    """One tiny run (a fresh preset model, 1 step, 2 held-out problems), as in test_exercise_train.py.
    The trainer's own English lines ([dpo] ..., [rl] step 2/20 reward ...) go to a log file, not
    between the Chinese lines; the user's function runs under a readable name, not exercise_5dab73e0."""
    from lmpo.teach.exercise.check import user_function
    from lmpo.teach.exercise.train import TrainOptions, train_exercise

    said = []
    fn = user_function(SOLUTIONS / "grpo_advantages_correct.py", EXERCISES["grpo_advantages"])
    opts = TrainOptions(steps=1, eval_problems=2, out=str(tmp_path), threads=1)
    yours, reference = train_exercise(EXERCISES["grpo_advantages"], fn, opts, model_dir="tiny", say=said.append,
                                      lang="zh")
    assert said[0].startswith("[exercise] grpo_advantages：把你的 grpo_advantages 用作 GRPO 阶段的优势估计器；"
                              "从 SFT 检查点 tiny 出发训练 1 步")
    assert said[1] == f"[exercise] 训练 1 步……训练器自己的日志（英文）写在 {tmp_path / 'yours.log'}"
    assert said[2].startswith("[exercise] 完成，用时 ") and "留出集准确率" in said[2]
    assert said[3] == "[exercise] 用 lmpo 的 grpo 跑同样的训练"
    assert all(_cjk(line) for line in said)
    captured = capsys.readouterr()
    assert "[rl]" not in captured.out + captured.err, captured
    log = (tmp_path / "yours.log").read_text()
    assert "[rl]" in log and "your_grpo_advantages advantages" in log and not re.search(r"exercise_[0-9a-f]{8}", log)
    assert "[rl] grpo advantages" in (tmp_path / "lmpo.log").read_text()
    assert yours.label == "你的" and reference.label == "lmpo grpo"


def test_train_exercise_in_english_leaves_the_trainer_lines_on_the_terminal(tmp_path, capsys):
    from lmpo.teach.exercise.check import user_function
    from lmpo.teach.exercise.train import TrainOptions, train_exercise

    fn = user_function(SOLUTIONS / "dpo_loss_correct.py", EXERCISES["dpo_loss"])
    opts = TrainOptions(steps=1, eval_problems=2, out=str(tmp_path), threads=1)
    train_exercise(EXERCISES["dpo_loss"], fn, opts, model_dir="tiny", say=lambda s: None, lang="en")
    captured = capsys.readouterr()
    assert "[dpo]" in captured.out + captured.err and not (tmp_path / "yours.log").exists()


def test_start_in_chinese_over_an_existing_file_refuses_in_chinese(tmp_path, capsys):
    from lmpo.cli.main import main

    out = tmp_path / "mine.py"
    out.write_text("# my work\n")
    assert main(["exercise", "start", "gae", "--out", str(out), "--lang", "zh"]) == 2
    err = capsys.readouterr().err
    assert "已存在" in err and "--force" in err and "exists;" not in err
    assert main(["exercise", "start", "gae", "--out", str(tmp_path / "nowhere" / "g.py"), "--lang", "zh"]) == 2
    assert "目录不存在" in capsys.readouterr().err
    assert out.read_text() == "# my work\n"


def test_chinese_exercises_use_the_terms_of_lmpo_explain():
    """`explain ppo --lang zh` says 裁剪, 回答, 词元; the exercises said 截断, 补全 and token for the same things."""
    import re

    from lmpo.teach.explain.text_zh import GLOSSARY, TEXT

    explain_zh = " ".join(TEXT.values())
    assert "裁剪" in GLOSSARY and "回答" in explain_zh and "词元" in explain_zh
    for ex in EXERCISES.values():
        texts = [starter_text(ex, "zh"), ex.summary["zh"], ex.plug.role["zh"]]
        texts += [p.checks["zh"] for p in ex.probes if isinstance(p.checks, dict)]
        for text in texts:
            prose = re.sub(r"`[^`]*`|[A-Za-z_]+token[A-Za-z_]*|token[A-Za-z_]+", "", text)
            assert "补全" not in prose and "截断代理" not in prose, (ex.name, text)
            assert not re.search(r"(?<![A-Za-z_])tokens?(?![A-Za-z_])", prose), (ex.name, text)


def test_train_in_chinese_trains_the_sft_start_without_its_english_log(tmp_path, capsys, monkeypatch):
    """The first `exercise train` trains the SFT start (CPT → SFT); in Chinese its trainers' lines go
    to OUT/sft_start.log (the start itself is replaced by a printing stand-in: this is about the words)."""
    import lmpo.teach.start as start
    from lmpo.teach.exercise.check import user_function
    from lmpo.teach.exercise.train import TrainOptions, train_exercise

    def trained(*args, **kwargs):
        print("[cpt] step 10/10  loss 1.0")
        return start.StartPoint(model_dir="tiny", sft_accuracy=0.3, cpt_accuracy=0.0, seconds=1.0, directory="d")

    monkeypatch.setattr(start, "is_cached", lambda *a, **k: False)
    monkeypatch.setattr(start, "sft_start", trained)
    said = []
    fn = user_function(SOLUTIONS / "dpo_loss_correct.py", EXERCISES["dpo_loss"])
    opts = TrainOptions(steps=1, eval_problems=2, out=str(tmp_path), threads=1)
    train_exercise(EXERCISES["dpo_loss"], fn, opts, say=said.append, lang="zh")
    assert said[0].startswith("[exercise] 先训练 SFT 起点检查点（只需一次") and str(tmp_path / "sft_start.log") in said[0]
    captured = capsys.readouterr()
    assert "[cpt]" not in captured.out + captured.err
    assert "[cpt] step 10/10" in (tmp_path / "sft_start.log").read_text()
