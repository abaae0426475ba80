"""The sentence on what clipped tokens receive agrees with the page's own gradient table."""

from __future__ import annotations

import pytest

from lmpo.teach.explain import explain

RL_PAGES = ("grpo", "dr_grpo", "rloo", "dapo", "gspo", "cispo", "reinforce_pp")


def clipped_gradients(expl) -> list[float]:
    clipped, grad = expl.value("clipped"), expl.value("grad")
    return [g for crow, grow in zip(clipped.rows, grad.rows) for c, g in zip(crow, grow) if c == 1.0]


@pytest.mark.parametrize("method", RL_PAGES)
def test_clipped_sentence_matches_the_table(method):
    expl = explain(method, "en")
    text = next(s.text for s in expl.steps if s.key == "gradient")
    moved = [g for g in clipped_gradients(expl) if abs(g) > 0]
    if moved:
        assert "still" in text, (method, moved, text)
        assert "clipped tokens get 0." not in text
    else:
        assert ("get 0" in text or "gets 0" in text) and "still" not in text, (method, text)


def test_some_pages_show_a_clipped_token_that_moves():
    """grpo (β·k3) and cispo (capped weight) must show it, or the test above checks nothing."""
    for method in ("grpo", "cispo"):
        assert any(abs(g) > 0 for g in clipped_gradients(explain(method, "en"))), method


@pytest.mark.parametrize("method", RL_PAGES)
def test_chinese_sentence_follows_the_same_parts(method):
    en = next(s.text for s in explain(method, "en").steps if s.key == "gradient")
    zh = next(s.text for s in explain(method, "zh").steps if s.key == "gradient")
    assert ("KL" in en) == ("KL" in zh)
    assert ("still" in en) == ("仍" in zh)
