"""`lmpo compare --lang zh`: its progress lines, table, recommendation, compare.md/compare.html and
refusals in Chinese, as the other teaching commands'; English output as it was before --lang."""

from __future__ import annotations

import json
import re

import pytest

from lmpo.cli.main import main
from lmpo.teach.compare import CompareConfig, refuse_changed_runs
from lmpo.teach.compare.execute import SPEC, RunSpec
from lmpo.teach.compare.plan import Method, plan_method
from lmpo.teach.compare.records import EvalPoint, RunRecord
from lmpo.teach.compare.render import Comparison, markdown, write_html
from lmpo.teach.compare.summary import MethodSummary, Spread, recommend

CJK = re.compile(r"[\u4e00-\u9fff]")
ENGLISH = re.compile(r"\b(points|seeds?|Recommendation|method|accuracy|noise|budget|start model|SFT start|"
                     r"steps?|pairs?|policy|reference|the|and|of)\b")
"""English words that a Chinese line should not hold (method names, flags and numbers may stay)."""


def _method(name, accs, seconds, mb, no_steps=()):
    n = len(accs)
    return MethodSummary(name, Spread.of(accs), Spread.of([seconds] * n), Spread.of([mb] * n), Spread.of([100] * n),
                         Spread.of([500] * n), ["policy", "reference"], "model, beta=0.04", "2 steps x 64",
                         "8 prompts x 8 completions per step, sampled by the policy", list(range(n)), list(no_steps))


CASES = {  # one of each branch of `recommend`
    "within noise": ([_method("a", [.6, .62, .64], 100, 900), _method("b", [.59, .61, .63], 40, 700)],
                     Spread.of([.3, .31, .32]), "samples"),
    "leanest": ([_method("a", [.6, .62, .64], 100, 500), _method("b", [.59, .61, .63], 40, 700)],
                Spread.of([.3]), "time"),
    "beyond noise": ([_method("a", [.6, .62, .64], 100, 900), _method("b", [.4, .41, .42], 40, 700)],
                     Spread.of([.3, .31, .32]), "samples"),
    "one seed": ([_method("a", [.5], 10, 1), _method("b", [.7], 10, 1)], Spread.of([.3]), "samples"),
    "tie below start": ([_method("a", [.5], 10, 1), _method("b", [.5], 5, 1)], Spread.of([.6]), "samples"),
    "only one, level": ([_method("a", [.5], 10, 1)], Spread.of([.5]), "samples"),
    "no steps anywhere": ([_method("a", [.5, .5], 10, 1), _method("d", [.3, .3], 3, 1, no_steps=(0, 1))],
                          Spread.of([.3, .3]), "time"),
    "no steps on one seed": ([_method("a", [.5, .6], 10, 1), _method("d", [.3, .4], 3, 1, no_steps=(1,))],
                             Spread.of([.5, .6]), "time"),
}


def _comparison(lang: str = "en") -> Comparison:
    runs = [RunRecord("a", 0, .6, 10., 300., 128, 900, "x", curve=[EvalPoint(0, 0., .3), EvalPoint(128, 10., .6)]),
            RunRecord("d", 0, .3, 3., 200., 0, 0, "y", no_steps=True)]
    methods = [_method("a", [.6], 10, 300), _method("d", [.3], 3, 200, no_steps=(0,))]
    label = {"en": "SFT start", "zh": "SFT 起点"}[lang]
    in_lang = {"lang": lang} if lang != "en" else {}  # English as before --lang: the same call
    return Comparison("lmpo compare --x", "sort_digits", {"kind": "time", "samples": 128, "minutes": 2.5}, [0],
                      Spread.of([.3]), methods,
                      recommend(methods, Spread.of([.3]), "time", start_label=label, minutes=2.5, **in_lang), runs,
                      label, **in_lang)


ENGLISH_MD = """Command: `lmpo compare --x`

Task sort_digits; budget kind=time, samples=128, minutes=2.5; seeds 0; accuracy is mean ± std over seeds (points), other columns mean (± std) over seeds.

| method | held-out accuracy | wall time (s) | peak memory (MB) | models held | reference | samples | completion tokens | budget |
|---|---|---|---|---|---|---|---|---|
| SFT start | 30.0% |  |  |  |  |  |  |  |
| a | 60.0% | 10 | 300 | policy, reference | model, beta=0.04 | 100 | 500 | 2 steps x 64 |
| d | 30.0% (0 steps: the start model) | 3.0 (reference pass only) | 200 | policy, reference | model, beta=0.04 | 100 | 500 | 2 steps x 64 |

- Highest mean held-out accuracy: a, 60.0% over 1 seed(s) (SFT start: 30.0%).
- d: trained 0 steps on every seed: its reference log-prob pass alone took longer than --minutes 2.5, so its accuracy there is the SFT start's and is not ranked. Raise --minutes (or lower --samples, which sets how many pairs that pass scores) to compare it.
- a gained +30.0 points over the SFT start.
- Recommendation: a — the only method that trained within the budget, so none to rank it against.
"""


def test_english_compare_md_is_as_before_lang():
    assert markdown(_comparison("en")) == ENGLISH_MD


def test_english_recommendations_are_as_before_lang():
    lines = recommend(*CASES["within noise"][:2]).lines
    assert lines == ["Highest mean held-out accuracy: a, 62.0% ± 2.0 over 3 seed(s) (SFT start: 31.0% ± 1.0).",
                     "b: 1.0 points below, within the seeds' spread (2.8 points).",
                     "a gained +31.0 points over the SFT start.",
                     "Within noise of the best: a, b; least wall time: b (40 s), least peak memory: b (700 MB).",
                     "Recommendation: b — as accurate as a within noise, and the quickest of those."]


@pytest.mark.parametrize("case", list(CASES))
def test_every_recommendation_line_is_chinese_under_zh(case):
    methods, start, budget = CASES[case]
    en = recommend(methods, start, budget, minutes=2.5).lines
    zh = recommend(methods, start, budget, start_label="SFT 起点", minutes=2.5, lang="zh").lines
    assert len(zh) == len(en)
    for line in zh:
        assert CJK.search(line) and not ENGLISH.search(re.sub(r"--\S+", "", line)), line
    assert zh[-1].startswith("推荐："), zh[-1]
    numbers = [re.findall(r"[+-]?\d+\.\d+%?", line) for line in en]
    assert numbers == [re.findall(r"[+-]?\d+\.\d+%?", line) for line in zh]  # the same figures, in other words


def test_compare_md_and_html_are_chinese_under_zh(tmp_path):
    c = _comparison("zh")
    md = markdown(c)
    assert md.startswith("命令：`lmpo compare --x`\n\n任务 sort_digits；预算 kind=time, samples=128, minutes=2.5；种子 0；")
    assert "| 方法 | 留出集准确率 | 耗时（秒） | 峰值内存（MB） | 所持模型 | 参考模型 | 样本数 | 回答词元数 | 预算 |" in md
    assert "| d | 30.0%（0 步：即起始模型） | 3.0（只算了参考模型的对数概率） |" in md
    assert "- 推荐：a —— 它是唯一在预算内训练了的方法" in md
    html = write_html(c, tmp_path).read_text()
    assert '<html lang="zh">' in html and "<h2>推荐</h2>" in html and "<h2>什么算一个样本</h2>" in html
    assert 'alt="留出集准确率随所用样本数的变化"' in html
    assert not re.search(r"Recommendation|Curves|Command|What counts", html)


def test_a_methods_words_in_the_table_are_chinese_under_zh():
    plans = {name: plan_method(CompareConfig(samples=256, lang="zh"), Method.parse(name), 0)
             for name in ("ppo", "dpo", "online_dpo")}
    assert plans["ppo"].amount == "4 步 x 64" and plans["dpo"].amount == "128 对 x 2"
    assert plans["online_dpo"].amount == "1 轮 x 256"
    assert plans["ppo"].what_counts == "每步 8 个提示 x 8 个回答，由策略模型采样"
    from lmpo.teach.compare.plan import held_words, reference_note

    assert held_words(plans["ppo"]) == ["策略模型", "参考模型", "价值网络"]  # explain's 价值网络 for the critic
    assert reference_note(plans["dpo"]) == "对数概率预先算好，模型已释放"
    english = plan_method(CompareConfig(samples=256), Method.parse("ppo"), 0)
    assert (english.amount, held_words(english)) == ("4 steps x 64", ["policy", "reference", "critic"])


@pytest.mark.parametrize("options, said", [
    ({"methods": "grpox"}, "compare：没有名为 'grpox' 的方法（是不是 'grpo'？）；可选 RL 预设（"),
    ({"methods": "grpo:ipo"}, "方法 'grpo:ipo'：':' 后面的损失只用于 dpo 和 online_dpo"),
    ({"methods": "grpo,grpo"}, "methods='grpo,grpo' 把一个方法写了两次"),
    ({"seeds": "0,x"}, "--seeds：应为逗号分隔的整数，而给出的是 '0,x'"),
    ({"budget": "time"}, "budget=time 需要 --minutes M > 0"),
    ({"budget": "days"}, "budget='days'：应为以下之一：samples, time"),
])
def test_refusals_are_chinese_under_zh(options, said):
    with pytest.raises(ValueError) as err:
        CompareConfig(lang="zh", **options).validate()
    assert said in str(err.value)


def test_a_budget_below_one_step_is_refused_in_chinese():
    with pytest.raises(ValueError, match="compare：8 个样本的预算不够 grpo 的一步，它要用 64 个（每步 8 个提示 x 8 个回答"):
        plan_method(CompareConfig(samples=8, lang="zh"), Method.parse("grpo"), 0)


@pytest.mark.parametrize("argv, line", [
    (["--methods", "grpox"], "lmpo：错误：compare：没有名为 'grpox' 的方法"),
    (["--threads", "abc"], "lmpo：错误：--threads：'abc' 不是整数"),
    (["--budget", "days"], "lmpo：错误：--budget：'days' 不是可选的值；可选：samples, time"),
    (["--start", "/nonexistent/model"], "lmpo：错误：--start /nonexistent/model：没有这个模型目录"),
])
def test_the_error_line_of_compare_lang_zh_is_chinese(argv, line, tmp_path, capsys):
    assert main(["compare", *argv, "--out", str(tmp_path / "cmp"), "--lang", "zh"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(line) and "\n" not in err, err


def test_lang_from_a_config_file_makes_the_error_line_chinese(tmp_path, capsys):
    config = tmp_path / "compare.yaml"
    config.write_text("lang: zh\nmethods: grpox\n")
    assert main(["compare", "--config", str(config), "--out", str(tmp_path / "cmp")]) == 2
    assert capsys.readouterr().err.startswith("lmpo：错误：compare：没有名为 'grpox' 的方法")


def _finished_run(cfg: CompareConfig, method: str, saved_config: dict) -> None:
    spec = RunSpec(cfg, Method.parse(method), 0, "start")
    spec.stage_dir.mkdir(parents=True)
    (spec.stage_dir / "result.json").write_text("{}")
    (spec.run_dir / SPEC).write_text(json.dumps({"config": saved_config, "method": method, "seed": 0,
                                                 "start_model": "start"}))


def test_runs_finished_before_lang_or_in_another_language_are_kept(tmp_path):
    """--lang says how a comparison is told, not how its runs train: a finished run is kept over it,
    as is one whose spec.json was written before compare had --lang."""
    en = CompareConfig(methods="grpo,dpo", seeds="0", samples=64, out=str(tmp_path))
    saved = json.loads(RunSpec(en, Method.parse("grpo"), 0, "").to_json())["config"]
    _finished_run(en, "grpo", saved)
    _finished_run(en, "dpo", {k: v for k, v in saved.items() if k != "lang"})  # written before --lang
    zh = CompareConfig(methods="grpo,dpo", seeds="0", samples=64, out=str(tmp_path), lang="zh")
    refuse_changed_runs(zh, [Method.parse("grpo"), Method.parse("dpo")])
    refuse_changed_runs(en, [Method.parse("grpo"), Method.parse("dpo")])
    with pytest.raises(ValueError, match=r"--out .* 里有用别的选项跑完的运行.*samples 64（现在是 128）"):
        refuse_changed_runs(CompareConfig(methods="grpo", seeds="0", samples=128, out=str(tmp_path), lang="zh"),
                            [Method.parse("grpo")])


def test_a_compare_in_chinese_then_in_english_over_one_out(start_model, tmp_path, capsys):
    out = tmp_path / "cmp"
    argv = ["compare", "--methods", "grpo,dpo", "--seeds", "0", "--samples", "64", "--threads", "1", "--device",
            "cpu", "--start", start_model, "--out", str(out)]
    assert main([*argv, "--lang", "zh"]) == 0
    said = capsys.readouterr().out
    assert "[compare] 种子 0 grpo：1 步 x 64 个样本；日志 " in said and "[compare] 种子 0 dpo：32 对 x 2 个样本" in said
    assert re.search(r"\[compare\] 种子 0 dpo：留出集准确率 [\d.]+%，\d+ 秒，峰值内存 [\d.]+ MB", said)
    assert "留出集平均准确率最高：" in said and "推荐：" in said and f"文件：{out / 'compare.md'}、" in said
    assert (out / "compare.md").read_text().startswith("命令：")
    assert json.loads((out / "compare.json").read_text())["lang"] == "zh"
    logs = {m: (out / "seed0" / m / "log.txt").stat().st_mtime_ns for m in ("grpo", "dpo")}

    assert main(argv) == 0  # the same runs, told in English: kept, nothing trained again
    said = capsys.readouterr().out
    assert "[compare] seed 0: every method finished earlier, kept" in said and "Recommendation: " in said
    assert not CJK.search(said) and not CJK.search((out / "compare.md").read_text())
    assert "lang" not in json.loads((out / "compare.json").read_text())
    assert logs == {m: (out / "seed0" / m / "log.txt").stat().st_mtime_ns for m in ("grpo", "dpo")}


def test_the_plots_stay_in_english_under_zh(tmp_path):
    """matplotlib's default fonts have no Chinese characters: a Chinese label is drawn as boxes."""
    import warnings

    from lmpo.teach.compare.render import plot

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plot(_comparison("zh"), tmp_path, "samples")
    assert not [w for w in caught if "Glyph" in str(w.message)], [str(w.message) for w in caught]


def test_each_text_has_the_same_fields_in_both_languages():
    from string import Formatter

    from lmpo.teach.compare.texts import TEXTS

    def fields(text):
        return {name for _, name, _, _ in Formatter().parse(text) if name}

    assert {key: fields(t["en"]) for key, t in TEXTS.items()} == {key: fields(t["zh"]) for key, t in TEXTS.items()}


def test_a_start_that_holds_no_model_is_refused_with_chinese_punctuation(tmp_path, capsys):
    (tmp_path / "notes").mkdir()
    argv = ["compare", "--start", str(tmp_path / "notes"), "--out", str(tmp_path / "cmp"), "--lang", "zh"]
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(f"lmpo：错误：--start：{tmp_path / 'notes'} 不是 Hugging Face 模型目录")
