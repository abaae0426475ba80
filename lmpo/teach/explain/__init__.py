"""`lmpo explain METHOD`: a worked numeric example of a method, computed by `lmpo.algos`.

`explain(method, lang)` returns an `Explanation` (steps with named values, diagrams, the preset,
when to choose the method, its papers); `render_terminal`, `write_html` and `write_markdown`
render the same object, so every number on every page is one the library computed.
"""

from __future__ import annotations

from lmpo.teach.explain.model import Diagram, Explanation, Step, Value, fmt
from lmpo.teach.explain.settings import METHODS

LANGS = ("en", "zh")


def explain(method: str, lang: str = "en") -> Explanation:
    """The worked example of `method` (one of `METHODS`) with prose in `lang` ("en" or "zh")."""
    from lmpo.teach.explain import ppo_example, pref_examples, rl_examples

    if method not in METHODS:
        from lmpo.teach.names import did_you_mean
        from lmpo.teach.refusals import refusal

        raise ValueError(refusal("unknown_method", lang, name=method, hint=did_you_mean(method, METHODS, lang),
                                 names=", ".join(METHODS)))
    if lang not in LANGS:
        raise ValueError(f"unknown language {lang!r}; choose one of: {', '.join(LANGS)}")
    if method == "ppo":
        return ppo_example.ppo(lang)
    if method == "reinforce_pp":
        return rl_examples.reinforce_pp(lang)
    if method in ("dpo", "ipo", "simpo"):
        return pref_examples.preference(method, lang)
    if method == "reward_model":
        return pref_examples.reward_model(lang)
    if method == "kl":
        return pref_examples.kl(lang)
    return rl_examples.sequence_method(method, lang)


__all__ = ["Diagram", "Explanation", "LANGS", "METHODS", "Step", "Value", "explain", "fmt"]
