"""One Chinese term per concept across explain, exercise, factcheck and their docs: the critic is
价值网络 (explain's word; factcheck said 评论家模型 / 价值模型 and explain also 价值函数), clip is
裁剪 (a starter said 截断), a completion is 回答 (补全), a token is 词元 (bare `token`)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CJK = re.compile(r"[\u4e00-\u9fff]")
CHOSEN = {"critic": "价值网络", "clip": "裁剪", "completion": "回答", "token": "词元"}
REJECTED = {
    "critic": r"评论家|价值模型|价值函数",
    # 截断 stays for clamp (k3's κ) and truncation (a sequence cut at the length limit)
    "clip": r"截断(代理|损失|目标)|PPO ?截断|剪切|裁切|修剪",
    "completion": r"补全|完成文本",
    "token": r"(?<![A-Za-z_])tokens?(?![A-Za-z_])|令牌",
}


def _prose(text: str) -> str:
    """Without code (`...`, a quoted literal), format fields, identifiers that contain "token", and the glossary's
    own English in parentheses after a term, e.g. 词元（token）."""
    text = re.sub(r"`[^`]*`|'[^'\n]*'|\{[^}]*\}|[A-Za-z_]+token[A-Za-z_]*|token[A-Za-z_]+", "", text)
    return re.sub(r"（[A-Za-z ,.\-/]+）|\([A-Za-z ,.\-/]+\)", "", text)


def _python_zh_texts() -> list[tuple[str, str]]:
    """Every string of lmpo/teach with a Chinese character in it, with where it is."""
    found = []
    for path in sorted((ROOT / "lmpo" / "teach").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and CJK.search(node.value):
                found.append((f"{path.relative_to(ROOT)}:{node.lineno}", node.value))
    return found


def _docs_zh_texts() -> list[tuple[str, str]]:
    found = [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted((ROOT / "docs" / "methods" / "zh").glob("*.md"))]
    exercises = (ROOT / "docs" / "exercises.md").read_text()
    return [*found, ("docs/exercises.md (中文说明)", exercises[exercises.index("## 中文说明"):])]


def test_the_chosen_terms_are_explains_and_in_its_glossary():
    from lmpo.teach.explain.text_zh import GLOSSARY, TEXT

    explain_zh = " ".join(TEXT.values())
    assert all(term in explain_zh for term in CHOSEN.values())
    assert {"价值网络", "裁剪"} <= set(GLOSSARY)


@pytest.mark.parametrize("concept", list(REJECTED))
def test_no_rejected_variant_in_the_chinese_texts(concept):
    texts = [*_python_zh_texts(), *_docs_zh_texts()]
    assert len(texts) > 500  # the scan found the texts
    hits = [f"{where}: {m.group(0)!r} in …{_prose(text)[max(0, m.start() - 15):m.end() + 15]}…"
            for where, text in texts for m in re.finditer(REJECTED[concept], _prose(text))]
    assert not hits, f"use {CHOSEN[concept]} for {concept}:\n" + "\n".join(hits)


def test_the_zh_diagrams_say_what_their_plot_shows(monkeypatch, tmp_path):
    """The plots are drawn once for both languages, with formula labels: the aggregation plot had
    "(each token)" on its y axis, and the zh DPO caption named the plot's "margin" 间隔 only."""
    from lmpo.teach.explain import diagrams
    from lmpo.teach.explain.text_zh import TEXT

    drawn = []
    monkeypatch.setattr(diagrams, "_save", lambda fig, path: drawn.append(fig))
    diagrams.aggregation(str(tmp_path / "a.png"))
    assert not re.search(r"[A-Za-z]{3,}", drawn[0].axes[0].get_ylabel())
    assert "∂L/∂margin" in TEXT["diagram.preference_dpo"] and "∂L/∂间隔" not in TEXT["diagram.preference_dpo"]


def test_the_zh_pages_say_why_their_plots_are_english():
    from lmpo.teach.explain.text_zh import TEXT
    from lmpo.teach.factcheck.texts import ui

    assert "英文" in TEXT["heading.diagrams"] and "中文字体" in TEXT["heading.diagrams"]
    assert "英文" in ui("zh")["intro"] and "中文字体" in ui("zh")["intro"]
