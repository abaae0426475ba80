"""Wording of `lmpo explain` that said more than the page shows: the `·`/push legend on pages with
neither, SimPO's "the defaults are DPO's" for a γ DPO does not have, the zh "计算自" ("computed
from"), and `lmpo explain grpo | head` leaving no HTML page."""

from __future__ import annotations

import html

import pytest

from lmpo.cli.main import main
from lmpo.teach.explain import METHODS, explain
from lmpo.teach.explain.page import Texts
from lmpo.teach.explain.render import render_html, render_markdown


@pytest.fixture(scope="module")
def pages():
    return {(m, lang): explain(m, lang) for m in METHODS for lang in ("en", "zh")}


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_legend_is_given_only_where_the_page_has_masked_cells_or_a_push_table(pages, lang):
    tx = Texts(lang)
    for method in METHODS:
        expl = pages[method, lang]
        masked = any(c is None for v in expl.values() for row in v.rows for c in row)
        push = any(v.name == "push" for v in expl.values())
        for page, esc in ((render_markdown(expl), str), (render_html(expl), html.escape)):
            assert (esc(tx("heading.note_masked")) in page) == masked, method
            assert (esc(tx("heading.note_push")) in page) == push, method
    for method in ("dpo", "ipo", "simpo", "reward_model", "kl"):
        assert "marks a position" not in render_markdown(pages[method, "en"])
    assert "marks a position" in render_markdown(pages["grpo", "en"])


def test_simpo_does_not_call_its_defaults_dpos(pages):
    en, zh = pages["simpo", "en"].when, pages["simpo", "zh"].when
    assert "the defaults are DPO's" not in en and "默认值是 DPO 的" not in zh
    beta = str(pages["simpo", "en"].settings["beta"])
    assert f"default β ({beta}) is the one DPO uses" in en and f"默认 β（{beta}）" in zh


def test_chinese_provenance_reads_computed_by(pages):
    page = render_markdown(pages["grpo", "zh"])
    assert "计算自" not in page and "（由 ADVANTAGES.get" in page and "计算）" in page


def test_the_page_is_written_even_when_the_terminal_text_is_cut_short(tmp_path, monkeypatch):
    def cut(*args, **kwargs):
        raise BrokenPipeError  # `lmpo explain grpo | head` closed the pipe

    monkeypatch.setattr("lmpo.teach.explain.render.render_terminal", cut)
    assert main(["explain", "grpo", "--out", str(tmp_path)]) == 141
    assert (tmp_path / "grpo.html").is_file()
