"""The language of `lmpo exercise`'s output (English or Chinese), and the messages of its frame.

A text shown to the user is either a plain string (the same in every language: a formula, a
name) or a dict ``{"en": ..., "zh": ...}``; `tr(text, lang)` picks one. The messages of the
check report and of `train` are the templates of `MESSAGES`, filled by `msg(key, lang, **fields)`;
each exercise keeps its own symptoms, bilingual, next to its probes.

A starter written with ``--lang zh`` says so on its second line, ``# lang: zh`` (the first stays
``# lmpo exercise: NAME``); `check` and `train` read it as their default language. A file without
that line is English.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from typing import Mapping, Union

LANGUAGES = ("en", "zh")

Text = Union[str, Mapping[str, str]]
"""A text in every language (a dict by language code), or one string for all of them."""

LANG_LINE = re.compile(r"^#\s*lang:\s*(.*?)\s*$")


def check_lang(lang: str) -> str:
    if lang not in LANGUAGES:
        raise ValueError(f"--lang must be one of {', '.join(LANGUAGES)}, got {lang!r}")
    return lang


def tr(text: Text, lang: str = "en") -> str:
    """`text` in `lang` (English where a translation is missing)."""
    if isinstance(text, str):
        return text
    return text.get(lang) or text["en"]


def both(en: str, zh: str) -> dict[str, str]:
    return {"en": en, "zh": zh}


def cat(*parts: Text) -> dict[str, str]:
    """The parts joined, language by language."""
    return {lang: "".join(tr(part, lang) for part in parts) for lang in LANGUAGES}


def msg(key: str, lang: str = "en", **fields) -> str:
    """The message `key` of `MESSAGES` in `lang`, with `fields` filled in."""
    return tr(MESSAGES[key], lang).format(**fields)


def language_of_file(path: str | Path) -> str:
    """The language a starter file was written in: its ``# lang: xx`` line among the comment lines
    at its top; "en" when there is none. ValueError (file, line) for a language lmpo lacks."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return "en"
    for number, line in enumerate(lines, 1):
        if not line.startswith("#"):
            break
        found = LANG_LINE.match(line)
        if found:
            if found.group(1) not in LANGUAGES:
                raise ValueError(f"{path}, line {number}: `{line.strip()}` names a language lmpo exercise "
                                 f"does not speak; write `# lang: en` or `# lang: zh`, or pass --lang")
            return found.group(1)
    return "en"


def width(text: str) -> int:
    """Columns `text` takes in a terminal (a Chinese character takes two)."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def ljust(text: str, n: int) -> str:
    return text + " " * max(0, n - width(text))


def rjust(text: str, n: int) -> str:
    return " " * max(0, n - width(text)) + text


MESSAGES: dict[str, dict[str, str]] = {
    # the check report (CheckReport.text)
    "report.header": both("exercise {exercise}: checking {function} against {reference}",
                          "练习 {exercise}：将 {function} 与 {reference} 对照检查"),
    "report.ok": both("  ok    {line}", "  通过  {line}"),
    "report.where": both(" (probe {probe}, input: {case})", "（检查项 {probe}，输入：{case}）"),
    "report.todo": both("  TODO  {probe}: not implemented yet — replace `raise NotImplementedError` with your code"
                        "{where}",
                        "  待完成 {probe}：尚未实现——把 `raise NotImplementedError` 换成你的代码{where}"),
    "report.error": both("  ERROR your code raised {exception}{where}", "  错误  你的代码抛出了 {exception}{where}"),
    "report.at": both("        at {location}", "        位置：{location}"),
    "report.fail": both("  FAIL  {probe}", "  失败  {probe}"),
    "report.symptom": both("symptom:  {text}", "症状：    {text}"),
    "report.input": both("input:    {text}", "输入：    {text}"),
    "report.inputs": both("          {text}", "          {text}"),
    "report.expected": both("expected: {text}", "期望：    {text}"),
    "report.got": both("got:      {text}", "实际：    {text}"),
    "report.first_difference": both("first difference: {text}", "第一处差异：{text}"),
    "report.pass": both("pass: {function} agrees with {reference} on every probe",
                        "通过：{function} 在每一项检查上都与 {reference} 一致"),
    "case.import": both("importing the file", "导入文件时"),
    "timeout": both("did not return within {seconds} s (an endless loop?)", "{seconds} 秒内没有返回（死循环？）"),
    "probe.random": both("{n} random inputs of varied sizes", "{n} 组大小各异的随机输入"),
    # how outputs differ (core.difference)
    "diff.count": both("expected {n} output(s) ({names}), got {got}", "应有 {n} 个输出（{names}），实际为 {got} 个"),
    "diff.type": both("{name}: expected a tensor, got {got}", "{name}：应为张量，实际为 {got}"),
    "diff.shape": both("{name}: expected shape {expected}, got {got}", "{name}：形状应为 {expected}，实际为 {got}"),
    "diff.dtype": both("{name}: expected dtype {expected}, got {got}", "{name}：dtype 应为 {expected}，实际为 {got}"),
    "diff.value": both("{name}{index}: expected {expected}, got {got}", "{name}{index}：期望 {expected}，实际 {got}"),
    "diff.gradient": both("gradient of sum(weights × output), weights 0.5 … 1.5",
                          "对 sum(weights × output) 求梯度，weights 取 0.5 … 1.5"),
    # symptoms no exercise-specific explainer recognised (core.generic_symptom, check._gradient_finding)
    "generic.type": both("your function returns the wrong kind of result ({where})",
                         "你的函数返回的结果类型不对（{where}）"),
    "generic.shape": both("your result has the wrong shape ({where})", "你的结果形状不对（{where}）"),
    "generic.dtype": both("your result's dtype differs from the reference's ({where}): keep the input's dtype "
                          "(compute in float64 if you like, then cast back with `.to(input.dtype)`)",
                          "你的结果的 dtype 与参考实现不同（{where}）：应保持输入的 dtype（可以在 float64 下计算，"
                          "再用 `.to(input.dtype)` 转回）"),
    "generic.nan": both("your result is NaN or infinite where the reference is finite ({where})",
                        "参考实现的结果是有限值，你的结果却是 NaN 或无穷（{where}）"),
    "generic.sign": both("your result has the wrong sign: it is exactly minus the reference",
                         "你的结果符号反了：恰好是参考结果的相反数"),
    "generic.ratio": both("your result is the reference times a constant: {ratio}× the reference",
                          "你的结果是参考结果乘以一个常数：为参考结果的 {ratio} 倍"),
    "generic.value": both("your result differs from the reference ({where})", "你的结果与参考实现不同（{where}）"),
    "mutated": both("your function changes its input `{name}` in place: the caller's tensor is not the same "
                    "after the call (the trainer may read it again); work on a copy, e.g. "
                    "`{name}.clone()`, or use operations that return new tensors",
                    "你的函数原地修改了输入 `{name}`：调用之后调用方的张量变了（训练器之后可能还会再用它）；"
                    "请在副本上操作（例如 `{name}.clone()`），或使用返回新张量的运算"),
    "diff.mutated": both("`{name}` after the call (got) against before it (expected)",
                         "调用之后的 `{name}`（实际）与调用之前（期望）对比"),
    "grad.flows": both("gradient flows through `{name}`, which the reference treats as a constant (missing "
                       "stop-gradient / detach)",
                       "梯度流过了 `{name}`，而参考实现把它当作常数（缺少 stop-gradient / detach）"),
    "grad.none": both("no gradient reaches `{name}`: your result does not depend on it through autograd "
                      "(a `.detach()`, `.item()` or `torch.no_grad()` too many?)",
                      "没有梯度传到 `{name}`：在 autograd 看来你的结果不依赖它（是不是多了一个 `.detach()`、"
                      "`.item()` 或 `torch.no_grad()`？）"),
    "grad.nan": both("your values agree, but your gradient with respect to `{name}` has NaN/inf where the "
                     "reference's is finite: an intermediate is NaN/inf at masked-out positions, and removing it "
                     "from the result (torch.where on the output, or × 0) does not stop NaN in the backward pass "
                     "(0 × NaN = NaN); mask the inputs before the operation that makes the NaN/inf",
                     "你的数值一致，但你对 `{name}` 的梯度含 NaN/inf，而参考实现的梯度是有限值：被掩码的位置上"
                     "有中间结果是 NaN/inf，从结果中去掉它（对输出用 torch.where，或乘以 0）挡不住反向传播中的 NaN"
                     "（0 × NaN = NaN）；请在产生 NaN/inf 的运算之前就对输入做掩码"),
    "grad.differs": both("the values agree but the gradient with respect to `{name}` differs from the "
                         "reference's (a term computed from a detached copy, or a mask applied after the loss?)",
                         "数值一致，但对 `{name}` 的梯度与参考实现不同（是不是某一项用了 detach 过的副本，"
                         "或者掩码在算完损失之后才应用？）"),
    # lmpo exercise start / train
    "start.wrote": both("wrote {path}: write `{function}`, then `lmpo exercise check {path}`",
                        "已写入 {path}：实现 `{function}`，然后运行 `lmpo exercise check {path}`"),
    "start.exists": both("{path} exists; pass --force to overwrite it (your code in it would be lost)",
                         "{path} 已存在；如要覆盖请加 --force（其中你写的代码会丢失）"),
    "start.no_dir": both("{path}: no such directory", "{path}：目录不存在"),
    "start.is_dir": both("--out {path}: names a directory; give the starter's file name, e.g. {example}",
                         "--out {path}：指向的是目录；请给出起始文件的文件名，例如 {example}"),
    "start.parent_file": both("--out {path}: {blocker} is a file, not a directory",
                              "--out {path}：{blocker} 是文件而不是目录"),
    "start.not_writable": both("--out {path}: cannot write there (no permission)",
                               "--out {path}：没有写入权限"),
    "train.check_pass": both("check: pass ({n} probes)", "检查：通过（{n} 项检查）"),
    "train.check_fail": both("check: FAIL at {probe}: {symptom}\ntraining anyway, to show what the difference does",
                             "检查：在 {probe} 处失败：{symptom}\n仍然继续训练，看看这个差异会造成什么影响"),
    "train.user_error": both("your code raised {exception} during training\n    at {location}",
                             "训练过程中你的代码抛出了 {exception}\n    位置：{location}"),
    "train.stopped": both("training with your function stopped: {error}\n    (the check above says why: {symptom})",
                          "用你的函数训练时中断：{error}\n    （原因见上面的检查结果：{symptom}）"),
    "train.failed_note": both("(your function failed the check above, so it is not lmpo's function whatever these "
                              "figures show)",
                              "（你的函数没有通过上面的检查，所以无论这些数字如何，它都不是 lmpo 的函数）"),
    "train.failed_note_alike": both("(your function failed the check above, so it is not lmpo's function whatever "
                                    "these figures show: {steps} steps may be too few for the difference to show)",
                                    "（你的函数没有通过上面的检查，所以无论这些数字如何，它都不是 lmpo 的函数："
                                    "{steps} 步可能还不足以显现差异）"),
    "train.start": both("[exercise] {name}: your {function} as {role}; {steps} steps from the SFT checkpoint "
                        "{model_dir}",
                        "[exercise] {name}：把你的 {function} 用作 {role}；从 SFT 检查点 {model_dir} 出发训练 "
                        "{steps} 步"),
    "train.reference": both("[exercise] the same run with lmpo's {reference}",
                            "[exercise] 用 lmpo 的 {reference} 跑同样的训练"),
    "train.sft_start": both("[exercise] training the SFT starting checkpoint first (once, about a minute; kept in "
                            "{directory}); its log: {log}",
                            "[exercise] 先训练 SFT 起点检查点（只需一次，约一分钟；保存在 {directory}）；训练日志写在 {log}"),
    "train.quiet": both("[exercise] training ({steps} steps); the trainer's log: {log}",
                        "[exercise] 训练 {steps} 步……训练器自己的日志（英文）写在 {log}"),
    "train.done": both("[exercise] done in {seconds} s: held-out accuracy {accuracy}",
                       "[exercise] 完成，用时 {seconds} 秒：留出集准确率 {accuracy}"),
    "train.yours": both("yours", "你的"),
    "table.run": both("run", "运行"),
    "table.accuracy": both("held-out accuracy", "留出集准确率"),
    "table.time": both("time (s)", "用时（秒）"),
    "table.dir": both("run directory", "运行目录"),
    "verdict.same": both("yours trains exactly like lmpo's here (same held-out accuracy, same metrics at every "
                         "step).",
                         "你的实现在这里与 lmpo 的训练结果完全相同（留出集准确率一致，每一步的指标也一致）。"),
    "verdict.same_accuracy": both("same held-out accuracy, but not the same run: {metric} at step {step} is {yours} "
                                  "with yours, {ref} with lmpo's. A different function (or rounding that grew over "
                                  "the steps) can end at the same accuracy; run `lmpo exercise check` on your file.",
                                  "留出集准确率相同，但训练过程不同：第 {step} 步的 {metric} 在你的实现中为 {yours}，"
                                  "在 lmpo 的实现中为 {ref}。不同的函数（或随步数累积的舍入误差）也可能得到相同的"
                                  "准确率；请对你的文件运行 `lmpo exercise check`。"),
    "verdict.no_learning": both("yours does not learn: {gain} points, where lmpo's gains {ref_gain}. "
                                "Run `lmpo exercise check` on your file.",
                                "你的实现没有学到东西：{gain} 个百分点，而 lmpo 的实现提升了 {ref_gain} 个百分点。"
                                "请对你的文件运行 `lmpo exercise check`。"),
    "verdict.compare": both("yours: {gain} points, lmpo's: {ref_gain} points ({closeness}; a correct function gives "
                            "the same run, up to floating-point rounding).",
                            "你的：{gain} 个百分点，lmpo 的：{ref_gain} 个百分点（{closeness}；正确的函数会得到相同的"
                            "训练结果，至多相差浮点舍入误差）。"),
    "verdict.close": both("close", "接近"),
    "verdict.different": both("different", "不同"),
}
