"""Reading a final answer out of a worked solution, and comparing two answers: the parts of a math
grader that `exact_match` offers (`extract=boxed`, `extract=last_number`, `math=1`).

What a model writes around its answer varies (`\\boxed{18}`, `The answer is $18.`, `#### 1,000`),
so the answer is extracted first, then compared as a math answer: as numbers where both sides
read as one (`1,000` = `1000` = `1000.00`, `0.5` = `1/2` = `\\frac{1}{2}`, `$18` = `18`,
`50\\%` = `50`), otherwise as text with spacing and LaTeX spacing removed."""

from __future__ import annotations

import re
from fractions import Fraction

_BOX_OPENERS = ("\\boxed", "\\fbox")
# a number as people and models write it: thousands separated by commas (`1,000`), a decimal
# part; `1,2` is not one number (a list, or a European decimal comma: neither is guessed at)
_NUMBER = r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[+-]?\.\d+"
_NUMBER_IN_TEXT = re.compile(rf"(?<![\w.])(?:{_NUMBER})(?![\d])")
_WHOLE_NUMBER = re.compile(rf"(?:{_NUMBER})(?:[eE][+-]?\d+)?")  # 1e-05: a float column's answer
_RATIO = re.compile(r"([+-]?\d+)/(\d+)")
_LATEX_FRACTION = re.compile(r"([+-]?)\\[dt]?frac\{([+-]?\d+)\}\{(\d+)\}")
_UNIT = re.compile(r"\\(?:text|mbox|mathrm)\{[^{}]*\}\s*$")  # 18\text{ dollars}
_NAMED = re.compile(r"^[A-Za-z]\s*=\s*")  # x = 3
# LaTeX that changes how an answer looks, not what it says
_LATEX_NOISE = re.compile(r"\\(?:left|right|displaystyle)(?![A-Za-z])|\\[!,; ]")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`), braces balanced; None when there
    is none or it is never closed. `\\boxed 5` (no braces) is read as `5`."""
    start, opener = max((text.rfind(opener), opener) for opener in _BOX_OPENERS)
    if start < 0:
        return None
    rest = text[start + len(opener):]
    if rest.startswith(" "):  # `\boxed 5`: the next word
        words = rest.split(maxsplit=1)
        return words[0].rstrip("$.") if words else None
    depth = 0
    for i, char in enumerate(rest if rest.startswith("{") else ""):
        depth += (char == "{") - (char == "}")
        if depth == 0:
            return rest[1:i]
    return None


def last_number(text: str) -> str | None:
    """The last number written in `text` (`-3`, `1,000`, `2.5`), as written; None without one."""
    found = _NUMBER_IN_TEXT.findall(_LATEX_NOISE.sub("", text).replace("{,}", ","))
    return found[-1] if found else None


def as_number(text: str) -> Fraction | None:
    """`text` as an exact number when it is one: an integer or decimal (thousands commas allowed,
    an exponent too) or a ratio `a/b` or `\\frac{a}{b}`; ignored around it: LaTeX's `$...$`, a
    currency `$`, a `%`, a unit in `\\text{...}` after it, a one-letter `x =` before it and a final
    full stop. None when it is anything else."""
    text = _LATEX_NOISE.sub("", text).replace("{,}", ",").strip()
    text = _UNIT.sub("", _NAMED.sub("", text.strip("$").strip())).strip("$").strip()
    text = text.removesuffix("\\%").removesuffix("%").removesuffix(".").strip()
    text = text.removeprefix("\\$").removeprefix("$").strip()
    if _WHOLE_NUMBER.fullmatch(text):
        return Fraction(text.replace(",", ""))
    for pattern in (_RATIO, _LATEX_FRACTION):
        match = pattern.fullmatch(text)
        if match:
            *sign, top, bottom = match.groups()
            if int(bottom) == 0:
                return None
            return Fraction(int(top), int(bottom)) * (-1 if sign and sign[0] == "-" else 1)
    return None


def normalized(text: str) -> str:
    """`text` for comparison as text: spaces, `\\left`/`\\right` and LaTeX spacing removed,
    `\\dfrac`/`\\tfrac` read as `\\frac`, outer `$` and a final full stop taken off."""
    text = _LATEX_NOISE.sub("", text).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return "".join(text.split()).strip("$").removesuffix(".")


def same_answer(got: str, want: str, math: bool) -> bool:
    """Whether two extracted answers agree. With `math`, as numbers where both read as one
    (`as_number`), otherwise as `normalized` text; without, exactly, outer whitespace aside."""
    if not math:
        return got.strip() == want.strip()
    got_number, want_number = as_number(got), as_number(want)
    if got_number is not None and want_number is not None:
        return got_number == want_number
    return normalized(got) == normalized(want)


EXTRACTORS = {"boxed": last_boxed, "last_number": last_number}
"""How `exact_match:extract=` finds the answer in a completion; each returns None when it has none."""
