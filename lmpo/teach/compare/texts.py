"""The words of `lmpo compare` in each language it speaks (`--lang en|zh`): its progress lines,
refusals, table, recommendation and pages. `tx(key, lang, **fields)` fills a template of `TEXTS`
(English for a language it lacks). Method names, flags, numbers and file names stay as they are;
the Chinese terms are explain's (`lmpo.teach.explain.text_zh.GLOSSARY`, tests/teach/test_zh_terms.py):
策略模型, 参考模型, 价值网络, 奖励模型, 回答, 词元."""

from __future__ import annotations

from lmpo.teach.compare.texts_rec import RECOMMEND
from lmpo.teach.refusals import localized

LANGUAGES = ("en", "zh")

TEXTS: dict[str, dict[str, str]] = {
    # progress lines (after `[compare] `)
    "sft_start": {"en": "seed {seed}: SFT start {model_dir} (held-out accuracy {accuracy:.1f}%)",
                  "zh": "种子 {seed}：SFT 起点 {model_dir}（留出集准确率 {accuracy:.1f}%）"},
    "seed_kept": {"en": "seed {seed}: every method finished earlier, kept ({dir})",
                  "zh": "种子 {seed}：每个方法之前都已跑完，保留（{dir}）"},
    "run_kept": {"en": "seed {seed} {method}: finished earlier, kept ({dir})",
                 "zh": "种子 {seed} {method}：之前已跑完，保留（{dir}）"},
    "run_start": {"en": "seed {seed} {method}: {amount} samples{cap}; log {log}",
                  "zh": "种子 {seed} {method}：{amount} 个样本{cap}；日志 {log}"},
    "run_cap": {"en": ", at most {minutes:g} min", "zh": "，最多 {minutes:g} 分钟"},
    "run_line": {"en": "seed {seed} {method}: {line}", "zh": "种子 {seed} {method}：{line}"},
    "run_no_steps": {"en": "seed {seed} {method}: trained 0 steps in {seconds:.1f} s: {stopped}; it counts as the "
                           "start model, and the other methods are compared on (raise --minutes to train it)",
                     "zh": "种子 {seed} {method}：{seconds:.1f} 秒内训练了 0 步：{stopped}；它按起始模型计，"
                           "其余方法照常比较（调大 --minutes 才能训练它）"},
    "run_done": {"en": "seed {seed} {method}: held-out accuracy {accuracy:.1f}%, {seconds:.0f} s{lost}, peak "
                       "{mb} MB",
                 "zh": "种子 {seed} {method}：留出集准确率 {accuracy:.1f}%，{seconds:.0f} 秒{lost}，峰值内存 {mb} MB"},
    "run_lost": {"en": " (and {seconds:.0f} s on steps a rollback abandoned, not counted, as their samples are not)",
                 "zh": "（另有 {seconds:.0f} 秒花在回滚丢弃的步上，不计入，正如它们的样本不计入）"},
    "files": {"en": "files: {md}, {json}, {html}", "zh": "文件：{md}、{json}、{html}"},
    "terminated": {"en": "lmpo compare: terminated (SIGTERM); the unfinished run under {out} starts again when the "
                         "same command is run",
                   "zh": "lmpo compare：已终止（SIGTERM）；再次执行同一命令时，{out} 下没跑完的运行会重新开始"},
    "no_steps_log": {"en": "[compare] {method}: trained 0 steps in {seconds:.1f} s: {stopped}. At --minutes "
                           "{minutes:g} that is its result: the comparison counts it as the start model (so it "
                           "wrote no model of its own)",
                     "zh": "[compare] {method}：{seconds:.1f} 秒内训练了 0 步：{stopped}。在 --minutes {minutes:g} "
                           "下这就是它的结果：比较时按起始模型计（所以它没有写出自己的模型）"},
    # refusals
    "refused": {"en": "compare: {problems}", "zh": "compare：{problems}"},
    "joiner": {"en": "; ", "zh": "；"},
    "twice_method": {"en": "methods={methods!r} names a method twice", "zh": "methods={methods!r} 把一个方法写了两次"},
    "twice_seed": {"en": "seeds={seeds!r} names a seed twice", "zh": "seeds={seeds!r} 把一个种子写了两次"},
    "samples_negative": {"en": "samples={samples} must be >= 0 (0 = the pipeline's grpo budget)",
                         "zh": "samples={samples} 必须 >= 0（0 表示 pipeline 的 grpo 阶段的预算）"},
    "time_needs_minutes": {"en": "budget=time needs --minutes M > 0", "zh": "budget=time 需要 --minutes M > 0"},
    "minutes_without_time": {"en": "minutes={minutes} is for --budget time; a sample budget runs to its samples",
                             "zh": "minutes={minutes} 用于 --budget time；样本预算会一直跑到用完样本"},
    "threads": {"en": "threads={threads} must be >= 0", "zh": "threads={threads} 必须 >= 0"},
    "precision": {"en": "precision={precision!r}: expected one of {choices}",
                  "zh": "precision={precision!r}：应为以下之一：{choices}"},
    "device": {"en": "--device {device}: {reason}", "zh": "--device {device}：用不了（{reason}）"},
    "literal": {"en": "{given}: expected one of {choices}", "zh": "{given}：应为以下之一：{choices}"},
    "list_empty": {"en": "--{name}: give at least one, comma-separated (got {text!r})",
                   "zh": "--{name}：至少给一个，用逗号分隔（给出的是 {text!r}）"},
    "list_kind": {"en": "--{name}: expected comma-separated {kind}s, got {text!r}",
                  "zh": "--{name}：应为逗号分隔的{kind}，而给出的是 {text!r}"},
    "kind.int": {"en": "int", "zh": "整数"},
    "kind.str": {"en": "str", "zh": "名称"},
    "unknown_method": {"en": "unknown method {name!r}{hint}; choose RL presets ({presets}), dpo or online_dpo",
                       "zh": "没有名为 {name!r} 的方法{hint}；可选 RL 预设（{presets}）、dpo 或 online_dpo"},
    "loss_not_rl": {"en": "method {name!r}: a loss after ':' is for dpo and online_dpo only",
                    "zh": "方法 {name!r}：':' 后面的损失只用于 dpo 和 online_dpo"},
    "loss_unknown": {"en": "method {name!r}: loss {loss!r}{hint} is not one of {losses}",
                     "zh": "方法 {name!r}：损失 {loss!r}{hint} 不在可选的损失之中；可选：{losses}"},
    "below_one_unit": {"en": "compare: a budget of {samples} samples is less than one {unit} of {method}, which uses "
                             "{per_unit} ({what}); a run never uses more than the budget, so give --samples {per_unit} "
                             "or more, or leave {method} out",
                       "zh": "compare：{samples} 个样本的预算不够 {method} 的一{unit}，它要用 {per_unit} 个（{what}）；"
                             "一次运行从不超出预算，所以请给 --samples {per_unit} 或更多，或者去掉 {method}"},
    "bad_start": {"en": "--start: {error}", "zh": "--start：{error}"},
    "no_start_dir": {"en": "--start {start}: no such model directory", "zh": "--start {start}：没有这个模型目录"},
    "changed_runs": {"en": "--out {out} holds finished runs made with other options, which this comparison would "
                           "report as its own: {runs}{more}. Use another --out, or delete those runs to train them "
                           "again",
                     "zh": "--out {out} 里有用别的选项跑完的运行，这次比较会把它们当成自己的来报告：{runs}{more}。"
                           "请换一个 --out，或者删掉这些运行以便重新训练"},
    "changed_more": {"en": " (and {n} more)", "zh": "（另有 {n} 个）"},
    "changed_option": {"en": "{option} {saved!r} (now {now!r})", "zh": "{option} {saved!r}（现在是 {now!r}）"},
    "changed_run": {"en": "{dir}: {changed}", "zh": "{dir}：{changed}"},
    "list_sep": {"en": ", ", "zh": "、"},
    "run_failed": {"en": "compare: {method} (seed {seed}) failed with exit code {code}; see {log}:\n  {tail}",
                   "zh": "compare：{method}（种子 {seed}）失败，退出码 {code}；见 {log}：\n  {tail}"},
    # what a method is at the budget (plan.py)
    "unit.steps": {"en": "steps", "zh": "步"},
    "unit.step": {"en": "step", "zh": "步"},
    "unit.pairs": {"en": "pairs", "zh": "对"},
    "unit.pair": {"en": "pair", "zh": "对"},
    "unit.rounds": {"en": "rounds", "zh": "轮"},
    "unit.round": {"en": "round", "zh": "轮"},
    "amount": {"en": "{units} {unit} x {per_unit}", "zh": "{units} {unit} x {per_unit}"},
    "what.dpo": {"en": "2 completions per pair trained on (written ahead of time, not sampled by the policy)",
                 "zh": "每对训练 2 个回答（事先写好，不是策略模型采样的）"},
    "what.online_dpo": {"en": "{prompts} prompts x {samples} samples per round, sampled by the policy",
                        "zh": "每轮 {prompts} 个提示 x {samples} 个样本，由策略模型采样"},
    "what.rl": {"en": "{prompts} prompts x {group} completions per step, sampled by the policy",
                "zh": "每步 {prompts} 个提示 x {group} 个回答，由策略模型采样"},
    "held.policy": {"en": "policy", "zh": "策略模型"},
    "held.reference": {"en": "reference", "zh": "参考模型"},
    "held.critic": {"en": "critic", "zh": "价值网络"},
    "held.critic (value head on the policy)": {"en": "critic (value head on the policy)",
                                               "zh": "价值网络（策略模型上的价值头）"},
    "held.reward model": {"en": "reward model", "zh": "奖励模型"},
    "ref.free": {"en": "none (reference-free loss)", "zh": "无（损失不需要参考模型）"},
    "ref.precomputed": {"en": "log-probs precomputed, model released", "zh": "对数概率预先算好，模型已释放"},
    "ref.model": {"en": "model", "zh": "模型"},
    "ref.none": {"en": "none", "zh": "无"},
    "ref.beta": {"en": "model, beta={beta:g}", "zh": "模型，beta={beta:g}"},
    "ref.beta0": {"en": "none (beta=0)", "zh": "无（beta=0）"},
    # the table, compare.md and compare.html
    "columns": {"en": "method|held-out accuracy|wall time (s)|peak memory (MB)|models held|reference|samples|"
                      "completion tokens|budget",
                "zh": "方法|留出集准确率|耗时（秒）|峰值内存（MB）|所持模型|参考模型|样本数|回答词元数|预算"},
    "label.sft": {"en": "SFT start", "zh": "SFT 起点"},
    "label.start": {"en": "start model", "zh": "--start 模型"},
    "reference_pass_only": {"en": "{seconds} (reference pass only)", "zh": "{seconds}（只算了参考模型的对数概率）"},
    "mark.none": {"en": " (0 steps: the start model)", "zh": "（0 步：即起始模型）"},
    "mark.some": {"en": " ({n} of {of} seeds: 0 steps)", "zh": "（{of} 个种子中有 {n} 个：0 步）"},
    "md_head": {"en": "Command: `{command}`\n\nTask {task}; budget {budget}; seeds {seeds}; accuracy is mean ± std "
                      "over seeds (points), other columns mean (± std) over seeds.\n\n",
                "zh": "命令：`{command}`\n\n任务 {task}；预算 {budget}；种子 {seeds}；准确率是各种子的均值 ± 标准差"
                      "（百分点），其余各列是各种子的均值（± 标准差）。\n\n"},
    "title": {"en": "lmpo compare — {task}, runs in {out}", "zh": "lmpo compare — {task}，运行目录 {out}"},
    "html_command": {"en": "Command: {command}", "zh": "命令：{command}"},
    "html_setup": {"en": "Task {task}; budget {budget}; seeds {seeds}. Accuracy: mean ± std over seeds (points); "
                         "other columns: mean (± std) over seeds.",
                   "zh": "任务 {task}；预算 {budget}；种子 {seeds}。准确率：各种子的均值 ± 标准差（百分点）；"
                         "其余各列：各种子的均值（± 标准差）。"},
    "html_recommendation": {"en": "Recommendation", "zh": "推荐"},
    "html_curves": {"en": "Curves", "zh": "曲线"},
    "html_caption": {"en": "held-out accuracy against {label}", "zh": "留出集准确率随{label}的变化"},
    "html_sample": {"en": "What counts as a sample", "zh": "什么算一个样本"},
    "html_what": {"en": "{method}: {what}.", "zh": "{method}：{what}。"},
    "plot.samples": {"en": "samples used", "zh": "所用样本数"},
    "plot.seconds": {"en": "wall time (s)", "zh": "耗时（秒）"},
    **RECOMMEND,
}


def tx(key: str, lang: str = "en", **fields) -> str:
    """The text `key` of `TEXTS` in `lang` (English for a language it lacks), with `fields` filled in."""
    return localized(TEXTS, key, lang, **fields)


def joined(items, lang: str = "en") -> str:
    """`a, b, c` (`a、b、c` in Chinese)."""
    return tx("list_sep", lang).join(map(str, items))
