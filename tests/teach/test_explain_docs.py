"""The prose tables, the committed docs/methods pages, the diagrams and the `lmpo explain` command."""

from __future__ import annotations

import math
import re
import string
from pathlib import Path

import pytest

from lmpo.cli.main import main
from lmpo.teach.explain import LANGS, METHODS, text_en, text_zh
from lmpo.teach.explain.docs import explanations, image_names, render_docs
from lmpo.teach.explain.page import annotate_terms
from lmpo.teach.explain.render import render_terminal

DOCS = Path(__file__).resolve().parents[2] / "docs" / "methods"
REGENERATE = "lmpo explain --all --docs docs/methods"


@pytest.fixture(scope="module")
def pages():
    return explanations()


def fields(entry: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(entry) if name}


def test_every_key_exists_in_both_languages_with_the_same_fields():
    assert set(text_en.TEXT) == set(text_zh.TEXT)
    for key, entry in text_en.TEXT.items():
        assert fields(entry) == fields(text_zh.TEXT[key]), key
        assert entry.strip() and text_zh.TEXT[key].strip(), key


def test_every_method_renders_in_both_languages(pages):
    from rich.console import Console

    for (lang, method), expl in pages.items():
        assert expl.steps and expl.diagrams and expl.papers and expl.commands, (lang, method)
        assert any("arXiv:" in p or "http" in p for p in expl.papers)
        console = Console(record=True, width=100, file=open("/dev/null", "w"))
        render_terminal(expl, console)
        assert expl.title in console.export_text()
    # the same numbers whatever the language
    for method in METHODS:
        en, zh = pages["en", method], pages["zh", method]
        assert [(v.name, v.rows) for v in en.values()] == [(v.name, v.rows) for v in zh.values()]


def _prose(expl) -> list[str]:
    return [expl.summary, expl.when] + [t for s in expl.steps for t in (s.title, s.text)] + [d.caption for d in expl.diagrams]


def test_chinese_pages_give_each_term_in_english_once_at_first_use(pages):
    glossary = text_zh.GLOSSARY
    for method in METHODS:
        prose = "\n".join(_prose(pages["zh", method]))
        annotated = [term for term, english in glossary.items() if f"{term}（{english}）" in prose]
        for term in annotated:
            english = glossary[term]
            assert prose.count(f"{term}（{english}）") == 1, (method, term)
            # the annotation comes before any other free use of the term
            first = prose.index(f"{term}（{english}）")
            longer = [t for t in glossary if t != term and term in t]
            head = prose[:first]
            for t in longer:
                head = head.replace(t, "")
            assert term not in head, (method, term)
        assert not re.search(r"）（|（[^（）]*（[A-Za-z]", prose), method  # no nested or doubled parentheses
    assert annotated  # the last page has some


# two or more English words in a row ("mean over pairs", "clip-higher"): prose, not a formula or a name
ENGLISH_RUN = re.compile(r"(?<![\w.'\-])[A-Za-z][a-z]+(?:[ -][A-Za-z]?[a-z]+)+(?![\w(\[])")
NAMES_KEPT_IN_ENGLISH = {"clip-higher"}  # DAPO's name for its technique, as the paper spells it


def _english_runs(text: str) -> list[str]:
    """English word runs left in Chinese text, once code spans and the English original given for a
    term in full-width parentheses after it (`奖励（reward）`, the glossary's convention) are removed."""
    text = re.sub(r"`[^`]*`", "", text)
    text = re.sub(r"（[^（）\u4e00-\u9fff]*[A-Za-z][^（）\u4e00-\u9fff]*）", "", text)
    return [run for run in ENGLISH_RUN.findall(text) if run not in NAMES_KEPT_IN_ENGLISH]


def test_english_run_rule():
    assert _english_runs("L — 损失（计算自 mean over pairs）") == ["mean over pairs"]
    assert _english_runs("梯度（计算自 torch.autograd.grad (policy term, β = 0)）") == ["policy term"]
    assert _english_runs("注意奖励被钻空子（reward hacking）；`lmpo train dpo --loss ipo`；A_i = R_i − mean R") == []


def test_chinese_pages_leave_no_english_prose(pages):
    """Every zh entry, and what the zh pages show besides: labels, sources and the papers' notes."""
    for key, entry in text_zh.TEXT.items():
        assert not _english_runs(entry), (key, _english_runs(entry))
    for method in METHODS:
        expl = pages["zh", method]
        shown = _prose(expl) + [expl.title] + [v.label for v in expl.values()] + [v.source for v in expl.values()]
        for text in shown:
            assert not _english_runs(text), (method, text)
        for paper in expl.papers:  # a paper's title stays as published; lmpo's note on it is translated
            notes = re.findall(r"\(([^()]*)\)", paper)
            assert not [n for n in notes if re.search(r"[a-z]{2,}", n)], (method, paper)


def test_sources_are_code_in_every_language(pages):
    """A value's source is the call that computed it (the same on both pages), never a phrase."""
    for (lang, method), expl in pages.items():
        for v in expl.values():
            assert not ENGLISH_RUN.findall(v.source), (lang, method, v.name, v.source)


def test_annotation_skips_terms_inside_longer_ones():
    glossary = {"奖励": "reward", "奖励模型": "reward model"}
    out = annotate_terms(["训练奖励模型。", "奖励很稀疏。", "奖励再次出现。"], glossary)
    assert out == ["训练奖励模型（reward model）。", "奖励（reward）很稀疏。", "奖励再次出现。"]


def test_committed_docs_are_up_to_date(pages):
    generated = render_docs(pages)
    for rel, text in generated.items():
        path = DOCS / rel
        assert path.is_file(), f"{path} is missing; run `{REGENERATE}`"
        assert path.read_text(encoding="utf-8") == text, f"{path} is stale; run `{REGENERATE}`"
    committed = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert committed == set(generated), f"pages the generator no longer writes: {committed - set(generated)}"
    images = {str(p.relative_to(DOCS)) for p in (DOCS / "img").glob("*.png")}
    assert images == image_names(pages), f"run `{REGENERATE}`"


def test_diagrams_are_drawn_as_png(tmp_path, pages):
    drawn = {}
    for expl in pages.values():
        for d in expl.diagrams:
            if d.key not in drawn:
                path = tmp_path / f"{d.key}.png"
                d.draw(str(path))
                drawn[d.key] = path
    for key, path in drawn.items():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", key
        assert path.stat().st_size > 5000, key
    assert {"group_normalisation", "zero_signal", "gae_masked", "kl_estimators", "aggregation"} <= set(drawn)


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


# closed forms in the diagram's x variable m = reward(y_w) − reward(y_l) (/work/shared/ALGORITHMS.md:
# dpo −log σ(h), ipo (h/β − 1/(2β))², simpo −log σ(h − γ), with h the margin): (L(m), dL/dm)
PREFERENCE_CLOSED_FORMS = {
    "dpo": lambda m, b, g: (-math.log(_sigmoid(m)), -_sigmoid(-m)),
    "ipo": lambda m, b, g: ((m / b - 1 / (2 * b)) ** 2, 2 * (m / b - 1 / (2 * b)) / b),
    "simpo": lambda m, b, g: (-math.log(_sigmoid(m - g)), -_sigmoid(g - m)),
}


@pytest.mark.parametrize("method", sorted(PREFERENCE_CLOSED_FORMS))
def test_preference_diagram_plots_the_loss_and_its_derivative_in_the_margin(method, pages, monkeypatch, tmp_path):
    """The curves drawn on the preference diagram, read back from the figure: the right panel is
    ∂L/∂margin w.r.t. the margin on the x-axis (not scaled by β or β²)."""
    from lmpo.teach.explain import diagrams

    figures = []
    monkeypatch.setattr(diagrams, "_save", lambda fig, path: figures.append(fig))
    (diagram,) = [d for d in pages["en", method].diagrams if d.key == f"preference_{method}"]
    diagram.draw(str(tmp_path / "p.png"))
    (fig,) = figures
    loss_ax, grad_ax = fig.axes
    assert grad_ax.get_ylabel() == "∂L/∂margin" and grad_ax.get_xlabel().startswith("margin")
    s = pages["en", method].settings
    beta, gamma = s["beta"], s.get("gamma")
    for ax, which in ((loss_ax, 0), (grad_ax, 1)):
        (line,) = [ln for ln in ax.get_lines() if ln.get_label() == method]
        xs, ys = line.get_xdata(), line.get_ydata()
        assert len(xs) > 100
        for m, y in zip(xs, ys):
            want = PREFERENCE_CLOSED_FORMS[method](float(m), beta, gamma)[which]
            assert y == pytest.approx(want, rel=1e-6, abs=1e-9), (method, which, float(m))
        if method == "dpo" and which == 1:  # −σ(−m) spans (−1, 0) on the plotted range
            assert min(ys) < -0.99 and max(ys) > -0.01


def test_cli_lists_explains_and_rejects(tmp_path, capsys):
    assert main(["explain"]) == 0
    listing = capsys.readouterr().out
    assert all(m in listing for m in METHODS)
    assert main(["explain", "kl", "--lang", "zh", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "KL 估计量" in out and (tmp_path / "kl.zh.html").is_file() and (tmp_path / "img" / "kl_estimators.png").is_file()
    assert main(["explain", "dpo", "--out", str(tmp_path)]) == 0
    html = (tmp_path / "dpo.html").read_text()
    assert 'data-name="pair_loss"' in html and "arXiv:2305.18290" in html
    assert main(["explain", "nope"]) == 2
    assert "unknown method 'nope'" in capsys.readouterr().err
    assert main(["explain", "--docs", str(tmp_path)]) == 2


@pytest.mark.parametrize("lang", LANGS)
def test_index_links_every_page(lang, pages):
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    for method in METHODS:
        assert f"({lang}/{method}.md)" in index


def test_every_text_entry_is_used(monkeypatch):
    """No dead or misspelt keys: building and rendering every page reads every entry."""
    from lmpo.teach.explain import page as page_module
    from lmpo.teach.explain.render import render_html, render_markdown

    used: set[str] = set()
    original = page_module.Texts.__call__

    def recording(self, key, **fields):
        used.add(key)
        return original(self, key, **fields)

    monkeypatch.setattr(page_module.Texts, "__call__", recording)
    pages = explanations()
    for expl in pages.values():
        render_html(expl), render_markdown(expl)
    render_docs(pages)
    from lmpo.cli.explain import _list

    _list("en")
    not_in_any_preset = {"word.std.population"}  # every preset's grpo std is "sample"
    assert set(text_en.TEXT) - used == not_in_any_preset
