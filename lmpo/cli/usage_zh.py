"""argparse's error line in Chinese, for a command given `--lang zh`: `lmpo explain grpo --lang zh
--bogus` said `lmpo explain: error: unrecognized arguments: --bogus` in English while the command's
own refusals were Chinese. The usage above it stays English, as `--help` does."""

from __future__ import annotations

import re

PATTERNS: list[tuple[re.Pattern[str], str]] = [(re.compile(pattern), zh) for pattern, zh in [
    (r"^unrecognized arguments: (?P<args>.*?)(?: \((?P<hints>.*)\))?$", "无法识别的参数：{args}{hints}"),
    (r"^the following arguments are required: (?P<names>.*)$", "缺少必需的参数：{names}"),
    (r"^argument (?P<arg>\S+): invalid choice: (?P<value>.*?)(?: \(did you mean (?P<near>.*)\?\))? "
     r"\(choose from (?P<choices>.*)\)$", "参数 {arg}：{value} 不是可选的值{near}；可选：{choices}"),
    (r"^argument (?P<arg>\S+): expected one argument$", "参数 {arg} 后面要给一个值"),
    (r"^argument (?P<arg>\S+): expected at most one argument$", "参数 {arg} 后面最多给一个值"),
    (r"^argument (?P<arg>\S+): expected at least one argument$", "参数 {arg} 后面至少要给一个值"),
    (r"^argument (?P<arg>\S+): invalid int value: (?P<value>.*)$", "参数 {arg}：{value} 不是整数"),
    (r"^argument (?P<arg>\S+): invalid float value: (?P<value>.*)$", "参数 {arg}：{value} 不是数"),
    (r"^argument (?P<arg>\S+): ignored explicit argument (?P<value>.*)$", "参数 {arg} 不带值（给出的是 {value}）"),
    (r"^ambiguous option: (?P<option>\S+) could match (?P<matches>.*)$", "选项 {option} 有歧义，可能是：{matches}"),
]]

HINTS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^(?P<flag>\S+): did you mean (?P<near>.*)\?$"), "{flag}：是不是 {near}？"),
    (re.compile(r"^(?P<flag>\S+): lmpo calls it (?P<ours>\S+)$"), "{flag}：lmpo 里叫 {ours}"),
]


def wants_chinese(argv: list[str]) -> bool:
    """Whether the command line asks for Chinese (`--lang zh` or `--lang=zh`), or, with no --lang,
    names an exercise file whose `# lang: zh` line makes its check and train answer in Chinese."""
    if any(arg == "--lang" or arg.startswith("--lang=") for arg in argv):
        return any(arg == "--lang=zh" or (arg == "--lang" and nxt == "zh") for arg, nxt in zip(argv, [*argv[1:], ""]))
    return argv[:1] == ["exercise"] and any(_starter_in_chinese(arg) for arg in argv[2:] if arg.endswith(".py"))


def _starter_in_chinese(file: str) -> bool:
    from lmpo.teach.exercise.lang import language_of_file

    try:
        return language_of_file(file) == "zh"
    except ValueError:  # a language lmpo lacks: its own refusal says so, after the usage error
        return False


def in_chinese(message: str) -> str:
    """argparse's `message` in Chinese; one it does not know stays as it is."""
    for pattern, zh in PATTERNS:
        found = pattern.match(message)
        if found:
            fields = {k: v or "" for k, v in found.groupdict().items()}
            if fields.get("near"):  # the same words as the teaching commands' refusals
                from lmpo.teach.refusals import refusal

                fields["near"] = refusal("did_you_mean", "zh", near=fields["near"])
            if "hints" in fields:
                fields["hints"] = f"（{'；'.join(_hint(h) for h in fields['hints'].split('; '))}）" if fields["hints"] else ""
            return zh.format(**fields)
    return message


def _hint(text: str) -> str:
    for pattern, zh in HINTS:
        found = pattern.match(text)
        if found:
            return zh.format(**found.groupdict())
    return text
