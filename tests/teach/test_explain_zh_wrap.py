"""`lmpo explain --lang zh` in an 80-column terminal: rich broke Chinese lines at the lone ASCII space
inside a short parenthesis, `对每个提示采样一组（G` then `个）回答` on the next line (and the same
with `（ε 0.2）`). Chinese prose is now broken by lmpo.teach.explain.cjk_wrap."""

from __future__ import annotations

import io

import pytest
from rich.cells import cell_len
from rich.console import Console

from lmpo.teach.explain import METHODS, explain
from lmpo.teach.explain.cjk_wrap import GROUP_CELLS, wrap_cjk
from lmpo.teach.explain.render import render_terminal


def _rendered(method: str, lang: str, width: int = 80) -> list[str]:
    out = io.StringIO()
    render_terminal(explain(method, lang), Console(file=out, width=width, force_terminal=False, color_system=None))
    return [line.strip("│ ") for line in out.getvalue().splitlines()]


def _split_groups(lines: list[str]) -> list[str]:
    """Short full-width parentheses that a line break cuts in two."""
    cut = []
    for line, after in zip(lines, lines[1:]):
        opened = line.rfind("（")
        if opened >= 0 and "）" not in line[opened:]:
            group = line[opened:] + after[:after.find("）") + 1]
            if "）" in after and cell_len(group) <= GROUP_CELLS:
                cut.append(group)
    return cut


@pytest.mark.parametrize("method", list(METHODS))
def test_no_short_parenthesis_is_cut_by_a_line_break(method):
    lines = _rendered(method, "zh")
    assert _split_groups(lines) == []
    assert max(cell_len(line) for line in lines) <= 80


def test_the_reported_panel_keeps_its_parentheses_whole():
    panel = "\n".join(_rendered("grpo", "zh"))
    assert "（G 个）回答" in panel and "（ε 0.2）" in panel


def test_the_breaks_of_the_wrapper():
    assert wrap_cjk("对每个提示采样一组（G 个）回答，分别打分", 22) == "对每个提示采样一组\n（G 个）回答，分别打分"
    assert wrap_cjk("一二三四五六七八九，十", 18) == "一二三四五六七八\n九，十"  # no line starts with a comma
    assert wrap_cjk("阿阿阿阿阿阿 reward hacking", 20) == "阿阿阿阿阿阿 reward\nhacking"  # Latin words whole
    assert wrap_cjk("第一行\n第二行", 80) == "第一行\n第二行"


def test_english_is_left_to_rich():
    lines = _rendered("grpo", "en")
    assert max(cell_len(line) for line in lines) <= 80 and any("Sample a group of G" in line for line in lines)
