"""`lmpo exercise start`: the starter file of an exercise, in English or Chinese."""

from __future__ import annotations

import os
from pathlib import Path

from lmpo.teach.exercise.core import Exercise
from lmpo.teach.exercise.lang import LANGUAGES, check_lang, msg, tr
from lmpo.trainers.fs_faults import blocking_file

HEADER = {
    "en": """# lmpo exercise: {name}
# {summary}
#
# Write the function below (replace `raise NotImplementedError`), then check it against
# lmpo's own implementation, {reference}:
#     lmpo exercise check {file}
# and see whether it trains (a short {stage} run, yours vs the library's):
#     lmpo exercise train {file}
# Keep the function's name and argument order; use torch only.
""",
    "zh": """# lmpo exercise: {name}
# lang: zh
# {summary}
#
# 完成下面的函数（替换 `raise NotImplementedError`），然后与 lmpo 自己的实现
# {reference} 对照检查：
#     lmpo exercise check {file}
# 再看它能否训练（一次简短的 {stage} 训练，你的实现与库的实现对比）：
#     lmpo exercise train {file}
# 保持函数名和参数顺序不变；只使用 torch。
""",
}

STAGE_NAMES = {"rl": "RL", "dpo": "DPO"}


def starter_text(exercise: Exercise, lang: str = "en", file: str = "") -> str:
    """The starter file: a header saying what to do, imports, the signature, the docstring
    (formula, shapes, masks, lmpo's conventions) and ``raise NotImplementedError``. A Chinese starter
    has the line ``# lang: zh`` after the first, so that `check` and `train` answer in Chinese."""
    check_lang(lang)
    stage = STAGE_NAMES.get(getattr(exercise.plug, "stage", ""), "training")
    header = HEADER[lang].format(name=exercise.name, summary=tr(exercise.summary, lang),
                                 reference=tr(exercise.reference_label, lang),
                                 file=file or f"{exercise.name}.py", stage=stage)
    imports = "from __future__ import annotations\n\nimport torch\nimport torch.nn.functional as F\nfrom torch import Tensor\n"
    if exercise.preamble:
        imports += exercise.preamble + "\n"
    todo = "TODO" if lang == "en" else "待完成"
    body = (f'{exercise.signature}\n    """{exercise.doc[lang]}\n    """\n'
            f'    raise NotImplementedError("{todo}: {exercise.function}")\n')
    return f"{header}\n{imports}\n\n{body}"


def write_starter(exercise: Exercise, out: str | Path, lang: str = "en", force: bool = False) -> Path:
    """Write the starter to `out`; an existing file is kept unless `force`."""
    path = Path(out)
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists; pass --force to overwrite it (your code in it would be lost)")
    if path.parent and not path.parent.exists():
        raise FileNotFoundError(f"{path.parent}: no such directory")
    path.write_text(starter_text(exercise, lang, file=str(path)))
    return path


def starter_path(exercise: Exercise, out: str, lang: str = "en", force: bool = False) -> Path:
    """`out` as the starter's file, checked before anything is written: a ValueError (or, for a
    missing directory, FileNotFoundError) in `lang` naming what is wrong."""
    path = Path(out)
    example = path / f"{exercise.name}.py"
    if out.endswith(("/", os.sep)) or path.is_dir():
        raise ValueError(msg("start.is_dir", lang, path=out, example=example))
    blocker = blocking_file(path.parent)
    if blocker is not None:
        raise ValueError(msg("start.parent_file", lang, path=out, blocker=blocker))
    if not path.parent.is_dir():
        raise FileNotFoundError(msg("start.no_dir", lang, path=path.parent))
    if path.exists() and not force:
        raise ValueError(msg("start.exists", lang, path=out))
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ValueError(msg("start.not_writable", lang, path=out))
    return path
