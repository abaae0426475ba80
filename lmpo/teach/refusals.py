"""The one-line errors of the teaching commands (explain, exercise, factcheck) in the language the
command was given: a learner who asked for Chinese reads why a command refused in Chinese too.

`refusal(key, lang, **fields)` fills a template of `REFUSALS`; `ready_out` is `ready_dir` (the
check of an --out before any work) with its words in `lang`; `error_prefix(lang)` begins the line
(`lmpo: error: `) and `os_error(err, lang)` says an operating-system error (a missing file, a
permission refused) with its path, the system's own English words kept in parentheses.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Callable

from lmpo.keyed import key_of

from lmpo.trainers.fs_faults import DISK_FULL_ERRNOS, OUT_WORDS, ready_dir

REFUSALS: dict[str, dict[str, str]] = {
    "did_you_mean": {"en": " (did you mean {near}?)", "zh": "（是不是 {near}？）"},
    "unknown_method": {"en": "unknown method {name!r}{hint}; choose one of: {names}",
                       "zh": "没有名为 {name!r} 的方法{hint}；可选：{names}"},
    "unknown_language": {"en": "unknown language {name!r}; choose one of: {names}",
                         "zh": "不支持的语言 {name!r}；可选：{names}"},
    "explain.docs_without_all": {"en": "--docs DIR writes every method's pages; add --all",
                                 "zh": "--docs DIR 会写出所有方法的页面；请同时加上 --all"},
    "explain.several": {"en": "{given} ask for different things: give one (METHOD explains one method, --list lists "
                              "them, --all writes every method's page)",
                        "zh": "{given} 要求的是不同的事：只给一个（METHOD 讲解一个方法，--list 列出所有方法，"
                              "--all 写出所有方法的页面）"},
    "exercise.unknown": {"en": "unknown exercise {name!r}{hint}; choose one of: {names}",
                         "zh": "没有名为 {name!r} 的练习{hint}；可选：{names}"},
    "exercise.header_unknown": {"en": "{path}: unknown exercise {name!r}{hint} in its header; choose one of: {names}",
                                "zh": "{path}：文件头里的练习 {name!r} 不存在{hint}；可选：{names}"},
    "exercise.cannot_tell_several": {
        "en": "{path}: cannot tell which exercise it is (several exercise functions found); pass --name, one of: "
              "{names}",
        "zh": "{path}：无法判断这是哪个练习（找到了多个练习函数）；请用 --name 指定，可选：{names}"},
    "exercise.cannot_tell_none": {
        "en": "{path}: cannot tell which exercise it is (no exercise functions found); pass --name, one of: {names}",
        "zh": "{path}：无法判断这是哪个练习（没有找到任何练习函数）；请用 --name 指定，可选：{names}"},
    "exercise.is_dir": {"en": "{path} is a directory: give your solution's Python file (e.g. {example})",
                        "zh": "{path} 是目录：请给出你的解答所在的 Python 文件（例如 {example}）"},
    "exercise.no_file": {"en": "{path}: no such file", "zh": "{path}：文件不存在"},
    "exercise.no_file_start": {"en": "{path}: no such file (write one with `lmpo exercise start {name}`)",
                               "zh": "{path}：文件不存在（可以用 `lmpo exercise start {name}` 写一个）"},
    "exercise.not_python": {"en": "{path}: not a Python file", "zh": "{path}：不是 Python 文件"},
    "exercise.not_utf8": {"en": "{path}: not UTF-8 text (byte {byte} at offset {offset}); save it as UTF-8",
                          "zh": "{path}：不是 UTF-8 文本（偏移 {offset} 处的字节 {byte}）；请以 UTF-8 编码保存"},
    "exercise.no_function": {"en": "{path}: defines no function `{function}` (exercise {name})",
                             "zh": "{path}：没有定义函数 `{function}`（练习 {name}）"},
    "exercise.steps": {"en": "--steps must be >= 1, got {value}", "zh": "--steps 必须 >= 1，而给出的是 {value}"},
    "exercise.eval_problems": {"en": "--eval-problems must be >= 1 (accuracy is what the runs are compared on), "
                                     "got {value}",
                               "zh": "--eval-problems 必须 >= 1（两次训练正是按准确率比较的），而给出的是 {value}"},
    "exercise.threads": {"en": "--threads must be >= 0, got {value}", "zh": "--threads 必须 >= 0，而给出的是 {value}"},
    "factcheck.only_empty": {"en": "--only {only!r} names no claim; give claim names (see --list), or leave --only "
                                   "out to run them all",
                             "zh": "--only {only!r} 没有给出任何论断；请给出论断名（见 --list），或者去掉 --only "
                                   "以运行全部论断"},
    "factcheck.only_twice": {"en": "--only {only!r} names {names} twice; name each claim once",
                             "zh": "--only {only!r} 把 {names} 写了两次；每个论断只写一次"},
    "factcheck.only_unknown": {"en": "--only: unknown claim(s) {named}; choose from: {names}",
                               "zh": "--only：没有这些论断：{named}；可选：{names}"},
    "factcheck.fast_none": {"en": "no claim selected: --fast leaves out {names} (training experiments, which --fast "
                                  "does not run)",
                            "zh": "没有选中任何论断：--fast 去掉了 {names}（它们是训练实验，--fast 不运行训练）"},
    "factcheck.threads": {"en": "--threads {threads}: must be >= 0 (0 = one per core)",
                          "zh": "--threads {threads}：必须 >= 0（0 表示每个核一个线程）"},
    "factcheck.foreign_out": {"en": "--out {out}: holds {found} that no factcheck wrote (no factcheck.json beside "
                                    "them), which a factcheck would replace; give a new directory",
                              "zh": "--out {out}：其中的 {found} 不是 factcheck 写的（旁边没有 factcheck.json），"
                                    "factcheck 会替换掉它们；请换一个新目录"},
}

def _model_is_file(path, model_dir, run) -> str:
    where = f"（{model_dir}：{run} 是运行目录，模型在那里）" if run else f"（{model_dir}）" if model_dir else ""
    return f"{path} 是文件；模型要以它所在的目录给出{where}"


def _not_model_dir(path, run_dir, inside) -> str:
    why = "这是运行目录（它的 config.json 存的是运行的选项）" if run_dir else "里面没有 config.json"
    hint = (f"；里面有一个模型：{inside[0]}；请改给 {inside[0]}" if len(inside) == 1 else
            f"；里面有这些模型：{', '.join(map(str, inside))}" if inside else "")
    return f"{path} 不是 Hugging Face 模型目录：{why}{hint}"


def _not_cached(name, near, presets, cache, unreachable) -> str:
    hint = REFUSALS["did_you_mean"]["zh"].format(near=repr(near)) if near else ""
    why = f"连不上 Hub（{unreachable}）" if unreachable else "设置了 HF_HUB_OFFLINE"
    return (f"模型 {name!r}{hint} 既不是本地目录也不是预设（{presets}），作为 Hugging Face Hub 的名字它又不在本机的缓存"
            f"（{cache}）里，而{why}。请检查名字，或者给出用 save_pretrained 保存的目录")


KEYED_ZH: dict[str, str | Callable[..., str]] = {
    "run_dir.in_use": "{flag} {path}：这个运行目录正被 {holder} 使用；请等它结束，或者换一个 --out",
    "model.is_file": _model_is_file,
    "model.not_model_dir": _not_model_dir,
    "model.no_dir": "模型目录 {path} 不存在（预设：{presets}）",
    "model.remote_code": "{path} 是带有自己 Python 代码的模型（{code}）；加载它就会运行这些代码，lmpo 只在给出 "
                         "--trust_remote_code true 时才这样做",
    "model.not_cached": _not_cached,
}
"""The Chinese of the errors lower layers raise through `lmpo.keyed.keyed` (their English is where
they are raised): a template, or a function of the error's fields."""


def said(err: BaseException, lang: str = "en") -> str | None:
    """`err` in `lang` when it was raised with a key this table says in `lang`; None otherwise
    (its own English text is what is said)."""
    found = key_of(err)
    if lang != "zh" or not found or found[0] not in KEYED_ZH:
        return None
    key, fields = found
    text = KEYED_ZH[key]
    return text.format(**fields) if isinstance(text, str) else text(**fields)


OUT_WORDS_ZH = {
    "is_file": "{flag} {out}：这是一个文件；请给出目录",
    "blocked": "{flag} {out}：{blocker} 是文件，无法在它下面建目录",
    "cannot_make": "{flag} {out}：无法创建这个目录（系统的说明：{reason}）",
    "not_writable": "{flag} {out}：这个目录不可写",
}
assert set(OUT_WORDS_ZH) == set(OUT_WORDS)


def localized(table: dict[str, dict[str, str]], key: str, lang: str = "en", **fields) -> str:
    """`table[key]` in `lang` (English for a language it lacks), with `fields` filled in."""
    texts = table[key]
    return (texts.get(lang) or texts["en"]).format(**fields)


def refusal(key: str, lang: str = "en", **fields) -> str:
    """The error `key` of `REFUSALS` in `lang`."""
    return localized(REFUSALS, key, lang, **fields)


def ready_out(out: str | Path, lang: str = "en", flag: str = "--out") -> Path:
    """`ready_dir(out, flag)`, refusing in `lang`."""
    return ready_dir(out, flag, words=OUT_WORDS_ZH if lang == "zh" else OUT_WORDS)


PREFIXES = {"error": {"en": "lmpo: error: ", "zh": "lmpo：错误："},
            "warning": {"en": "lmpo: warning: ", "zh": "lmpo：警告："},
            "interrupted": {"en": "lmpo: interrupted", "zh": "lmpo：已中断"}}


def error_prefix(lang: str = "en", kind: str = "error") -> str:
    """`lmpo: error: ` (or `warning`, `interrupted`) in `lang`."""
    texts = PREFIXES[kind]
    return texts.get(lang) or texts["en"]


OS_CAUSES_ZH = {
    errno.ENOENT: "文件或目录不存在",
    errno.EACCES: "没有权限",
    errno.EPERM: "没有权限",
    errno.EROFS: "文件系统是只读的",
    errno.EISDIR: "这是一个目录，不是文件",
    errno.ENOTDIR: "路径中的某一部分是文件，不是目录",
    errno.EEXIST: "已经存在",
    **{code: "设备上没有剩余空间（磁盘已满）" for code in DISK_FULL_ERRNOS},
}


def os_error_zh(err: OSError) -> str:
    """An OSError in Chinese: the path, the cause, and the system's own words in parentheses."""
    cause = OS_CAUSES_ZH.get(err.errno, "操作系统报错")
    said = f"（系统的说明：{err.strerror}）" if err.strerror else ""
    path = f"{err.filename} -> {err.filename2}" if err.filename2 else err.filename
    return f"{path}：{cause}{said}" if path else f"{cause}{said}"
