"""Every number on an explain page is the output of the lmpo.algos function it claims.

For each method the test recomputes every value of the worked example on its own — from the
example's given inputs, the presets and the trainers' defaults, calling `lmpo.algos` directly —
and compares: with the step objects, and with the numbers read back out of the rendered HTML
and markdown pages, in both languages.
"""

from __future__ import annotations

import math
import re
from html.parser import HTMLParser

import pytest
import torch

from lmpo.algos import (ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, PREFERENCE_LOSSES, TOKEN_ADVANTAGES,
                        bradley_terry_loss, clipped_value_loss, group_means, groups_with_signal, masked_mean,
                        masked_whiten, overlong_penalty, token_logprobs, token_rewards)
from lmpo.teach.explain import LANGS, METHODS, explain, fmt
from lmpo.teach.explain import inputs as demo
from lmpo.teach.explain.render import render_html, render_markdown
from lmpo.trainers.presets import RL_PRESETS
from lmpo.trainers.preference import PreferenceConfig
from lmpo.trainers.reward_model import RewardModelConfig
from lmpo.trainers.rl_config import RLConfig


def given(expl, name):
    """(tensor with masked cells 0, mask) of a given value, as the page shows it."""
    value = expl.value(name)
    assert value.given, name
    rows = [[0.0 if c is None else c for c in row] for row in value.rows]
    mask = [[0.0 if c is None else 1.0 for c in row] for row in value.rows]
    t, m = torch.tensor(rows, dtype=torch.float64), torch.tensor(mask, dtype=torch.float64)
    return (t[0], m[0]) if len(rows) == 1 else (t, m)


def rl_settings(method):
    defaults = {f: getattr(RLConfig, f) for f in RLConfig.__dataclass_fields__ if hasattr(RLConfig, f)}
    return {**defaults, **RL_PRESETS[method].settings}


def policy_part(s, out, logprobs, old, adv, mask, ref=None):
    fn = POLICY_LOSSES.get(s["loss"])
    kwargs = {"clip_eps_low": s["clip_eps_low"], "clip_eps_high": s["clip_eps_high"]}
    if s["loss"] == "ppo_clip":
        kwargs["dual_clip"] = s["dual_clip"] or None
    token_loss, info = fn(logprobs, old, adv, mask, **kwargs)
    out["token_loss"], out["clipped"] = (token_loss, mask), (info["clipped"], mask)
    total = token_loss
    if ref is not None and s["beta"] > 0 and s["kl_placement"] == "loss":
        kl = KL_ESTIMATORS.get(s["kl_estimator"])(logprobs, ref)
        total = token_loss + s["beta"] * kl * mask
        out["kl"], out["token_loss_kl"] = (kl, mask), (total, mask)
    return AGGREGATIONS.get(s["aggregation"])(total, mask, max_len=s["max_len_norm"] or s["max_new_tokens"])


def ratios(out, method, logprobs, old, mask):
    rho = (logprobs.detach() - old) * mask
    out["log_ratio"] = (rho, mask)
    if method == "gspo":
        out["seq_log_ratio"] = (masked_mean(rho, mask, dim=-1), None)
        out["seq_ratio"] = (masked_mean(rho, mask, dim=-1).exp(), None)
    else:
        out["ratio"] = (rho.exp(), mask)


def gradient(out, loss, logprobs, mask):
    grad = torch.autograd.grad(loss, logprobs)[0]
    out["grad"], out["push"] = (grad, mask), (-torch.sign(grad), mask)


def expected_sequence_method(method, expl):
    s, out = rl_settings(method), {}
    rewards, _ = given(expl, "rewards")
    ids = torch.zeros(len(rewards), dtype=torch.long)
    if method == "dapo":
        batch, _ = given(expl, "batch_rewards")
        groups, _ = given(expl, "batch_groups")
        out["keep"] = (groups_with_signal(batch, groups.long()).double(), None)
        lengths, _ = given(expl, "lengths")
        out["penalty"] = (overlong_penalty(lengths.long(), s["max_new_tokens"], s["overlong_cache"]), None)
    estimator = ADVANTAGES.get(s["advantage"])
    options = {"std": s["std"], "scale": s["scale"], "eps": s["advantage_eps"]} if s["advantage"] == "grpo" else {}
    adv = estimator(rewards, ids, **options)
    out["group_mean"], out["advantages"] = (group_means(rewards, ids), None), (adv, None)
    old, mask = given(expl, "old_logprobs")
    logprobs = given(expl, "logprobs")[0].requires_grad_(True)
    ratios(out, method, logprobs, old, mask)
    ref = given(expl, "ref_logprobs")[0] if "kl" in [v.name for v in expl.values()] else None
    loss = policy_part(s, out, logprobs, old, adv[:, None], mask, ref)
    out["loss"] = (loss, None)
    gradient(out, loss, logprobs, mask)
    if method in ("grpo", "dr_grpo", "rloo"):
        flat, _ = given(expl, "flat_rewards")
        flat_adv = estimator(flat, ids, **options)
        lp = given(expl, "logprobs")[0].requires_grad_(True)
        flat_loss = policy_part({**s, "beta": 0.0}, {}, lp, old, flat_adv[:, None], mask)
        out["flat_advantages"] = (flat_adv, None)
        out["flat_grad"] = (torch.autograd.grad(flat_loss, lp)[0], mask)
    return out


def expected_reinforce_pp(expl):
    s, out = rl_settings("reinforce_pp"), {}
    rewards, _ = given(expl, "rewards")
    old, mask = given(expl, "old_logprobs")
    ref, _ = given(expl, "ref_logprobs")
    k1 = KL_ESTIMATORS.get("k1")(old, ref) * mask
    per_token = token_rewards(rewards, mask, kl=k1, beta=s["beta"])
    adv, returns = TOKEN_ADVANTAGES.get("reinforce_pp")(per_token, mask, gamma=s["gamma"])
    out.update(k1=(k1, mask), token_rewards=(per_token, mask), returns=(returns, mask), advantages=(adv, mask))
    logprobs = given(expl, "logprobs")[0].requires_grad_(True)
    ratios(out, "reinforce_pp", logprobs, old, mask)
    loss = policy_part(s, out, logprobs, old, adv, mask)
    out["loss"] = (loss, None)
    gradient(out, loss, logprobs, mask)
    return out


def expected_ppo(expl):
    s, out = rl_settings("ppo"), {}
    rewards, _ = given(expl, "rewards")
    old, mask = given(expl, "old_logprobs")
    ref, _ = given(expl, "ref_logprobs")
    old_values, _ = given(expl, "old_values")
    k1 = KL_ESTIMATORS.get("k1")(old, ref) * mask
    per_token = token_rewards(rewards, mask, kl=k1, beta=s["beta"])
    adv, returns = TOKEN_ADVANTAGES.get("gae")(per_token, mask, values=old_values, gamma=s["gamma"], lam=s["gae_lambda"])
    white = masked_whiten(adv, mask, eps=s["whiten_eps"], unbiased=s["whiten_std"] == "sample")
    out.update(k1=(k1, mask), token_rewards=(per_token, mask), gae_advantages=(adv, mask), returns=(returns, mask),
               advantages=(white, mask))
    logprobs = given(expl, "logprobs")[0].requires_grad_(True)
    values = given(expl, "values")[0].requires_grad_(True)
    ratios(out, "ppo", logprobs, old, mask)
    policy = policy_part(s, out, logprobs, old, white, mask)
    value_loss, info = clipped_value_loss(values, old_values, returns, mask, clip_eps_value=s["clip_eps_value"])
    critic = AGGREGATIONS.get(s["aggregation"])(value_loss, mask)
    total = policy + s["vf_coef"] * critic
    out.update(value_loss=(value_loss, mask), value_clipped=(info["clipped"], mask), policy_loss=(policy, None),
               critic_loss=(critic, None), loss=(total, None))
    grad, value_grad = torch.autograd.grad(total, (logprobs, values))
    out.update(grad=(grad, mask), push=(-torch.sign(grad), mask), value_grad=(value_grad, mask))
    return out


def expected_preference(method, expl):
    cfg = {"beta": PreferenceConfig.beta, **({"gamma": PreferenceConfig.gamma} if method == "simpo" else {})}
    chosen = given(expl, "chosen_logps")[0].requires_grad_(True)
    rejected = given(expl, "rejected_logps")[0].requires_grad_(True)
    refs = [given(expl, n)[0] if method != "simpo" else None for n in ("ref_chosen_logps", "ref_rejected_logps")]
    lengths = {} if method == "dpo" else {"chosen_lengths": given(expl, "chosen_lengths")[0],
                                          "rejected_lengths": given(expl, "rejected_lengths")[0]}
    loss, figures = PREFERENCE_LOSSES.get(method)(chosen, rejected, *refs, **lengths, **cfg)
    grad_w, grad_l = torch.autograd.grad(loss.mean(), (chosen, rejected))
    out = {k: (figures[k], None) for k in ("chosen_reward", "rejected_reward", "margin", "accuracy")}
    out.update(pair_loss=(loss, None), loss=(loss.mean(), None), grad_chosen=(grad_w, None), grad_rejected=(grad_l, None))
    return out


def expected_reward_model(expl):
    chosen = given(expl, "chosen_scores")[0].requires_grad_(True)
    rejected = given(expl, "rejected_scores")[0].requires_grad_(True)
    loss, figures = bradley_terry_loss(chosen, rejected, margin=RewardModelConfig.margin,
                                       center_coef=RewardModelConfig.center_coef)
    grad_w, grad_l = torch.autograd.grad(loss.mean(), (chosen, rejected))
    demo_loss, _ = bradley_terry_loss(chosen.detach(), rejected.detach(), margin=demo.RM_MARGIN_DEMO,
                                      center_coef=demo.RM_CENTER_DEMO)
    return {"margin": (figures["margin"], None), "accuracy": (figures["accuracy"], None), "pair_loss": (loss, None),
            "loss": (loss.mean(), None), "grad_chosen": (grad_w, None), "grad_rejected": (grad_l, None),
            "demo_pair_loss": (demo_loss, None)}


def expected_kl(expl):
    z, _ = given(expl, "policy_logits")
    z_ref, _ = given(expl, "reference_logits")
    vocab = torch.arange(len(z))
    logprobs = token_logprobs(z.expand(len(vocab), -1), vocab).requires_grad_(True)
    ref = token_logprobs(z_ref.expand(len(vocab), -1), vocab)
    probs = logprobs.detach().exp()
    out = {"logprobs": (logprobs, None), "ref_logprobs": (ref, None), "probs": (probs, None),
           "exact_kl": ((probs.double() * (logprobs.detach().double() - ref.double())).sum(), None)}
    for name in ("k1", "k2", "k3"):
        k = KL_ESTIMATORS.get(name)(logprobs, ref)
        out[name] = (k, None)
        out[f"mean_{name}"] = ((probs * k.detach()).sum(), None)
        out[f"grad_{name}"] = (torch.autograd.grad(k.sum(), logprobs)[0], None)
    return out


def expected(method, expl):
    if method == "ppo":
        return expected_ppo(expl)
    if method == "reinforce_pp":
        return expected_reinforce_pp(expl)
    if method in ("dpo", "ipo", "simpo"):
        return expected_preference(method, expl)
    if method == "reward_model":
        return expected_reward_model(expl)
    if method == "kl":
        return expected_kl(expl)
    return expected_sequence_method(method, expl)


def as_cells(tensor, mask):
    """Expected cells, with None where masked, as the pages show them."""
    t = tensor.detach().double()
    t = t.reshape(1, -1) if t.dim() < 2 else t
    m = None if mask is None else mask.reshape(t.shape)
    return [[None if m is not None and m[i, j] == 0 else float(t[i, j]) for j in range(t.shape[1])]
            for i in range(t.shape[0])]


def close(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=2e-5, abs_tol=1e-6)


def assert_rows(name, expected_rows, shown_rows):
    assert len(expected_rows) == len(shown_rows), name
    for er, sr in zip(expected_rows, shown_rows):
        assert len(er) == len(sr), name
        for e, s in zip(er, sr):
            assert close(e, s), f"{name}: page shows {s}, lmpo.algos gives {e}"


def parse_cell(text: str):
    return None if text == "·" else float(text)


class ValueTables(HTMLParser):
    """name → rows of cell texts, from `<table class="value" data-name=...>` (numeric cells only)."""

    def __init__(self):
        super().__init__()
        self.tables, self.current, self.in_num = {}, None, False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table" and attrs.get("class") == "value":
            self.current = self.tables.setdefault(attrs["data-name"], [])
        elif tag == "tr" and self.current is not None:
            self.current.append([])
        elif tag == "td" and attrs.get("class") == "num":
            self.in_num = True

    def handle_endtag(self, tag):
        if tag == "table":
            self.current = None
        self.in_num = False if tag == "td" else self.in_num

    def handle_data(self, data):
        if self.in_num and self.current is not None:
            self.current[-1].append(data)


def html_values(page: str) -> dict[str, list[list]]:
    parser = ValueTables()
    parser.feed(page)
    return {name: [[parse_cell(c) for c in row] for row in rows if row] for name, rows in parser.tables.items()}


def markdown_values(page: str) -> dict[str, list[list]]:
    out = {}
    for block in re.split(r"^<!-- value: ", page, flags=re.M)[1:]:
        name, _, body = block.partition(" -->")
        rows = [line for line in body.splitlines() if line.startswith("|")][2:]  # skip header and rule
        cells = [re.split(r"(?<!\\)\|", row.strip().strip("|"))[1:] for row in rows]  # `\|` is a literal pipe
        out[name] = [[parse_cell(c.strip()) for c in row] for row in cells]
    return out


@pytest.fixture(scope="module")
def pages():
    return {(m, lang): explain(m, lang) for m in METHODS for lang in LANGS}


@pytest.mark.parametrize("method", METHODS)
def test_every_computed_value_equals_lmpo_algos(method, pages):
    expl = pages[method, "en"]
    want = expected(method, expl)
    names = [v.name for v in expl.values()]
    assert len(names) == len(set(names)), "a value name appears twice"
    computed = {v.name for v in expl.values() if not v.given}
    assert computed == set(want), f"unchecked: {computed - set(want)}, missing: {set(want) - computed}"
    for name, (tensor, mask) in want.items():
        assert_rows(name, as_cells(tensor, mask), expl.value(name).rows)


@pytest.mark.parametrize("method", METHODS)
def test_rendered_pages_show_exactly_those_numbers(method, pages):
    want = expected(method, pages[method, "en"])
    for lang in LANGS:
        expl = pages[method, lang]
        shown_values = {v.name: v for v in expl.values()}
        for render, parse in ((render_html, html_values), (render_markdown, markdown_values)):
            shown = parse(render(expl))
            assert set(shown) == set(shown_values), (lang, render.__name__)
            for name, rows in shown.items():
                if name in want:
                    assert_rows(f"{lang} {render.__name__} {name}", as_cells(*want[name]), rows)
                else:  # a given input: the page shows what the example was given
                    assert_rows(name, [[None if c is None else float(fmt(c)) for c in r]
                                       for r in shown_values[name].rows], rows)


def test_the_numbers_agree_with_the_worked_example_in_the_notes(pages):
    """ALGORITHMS.md: rewards 0.9, 0.6, 0.2, 0.0 give these advantages."""
    notes = {"grpo": [1.17833, 0.43412, -0.55816, -1.05430], "dr_grpo": [0.475, 0.175, -0.225, -0.425],
             "rloo": [0.63333, 0.23333, -0.30000, -0.56667]}
    for method, values in notes.items():
        shown = pages[method, "en"].value("advantages").rows[0]
        assert shown == pytest.approx(values, abs=2e-5)  # the notes round to 5 decimals


def test_the_comparison_catches_a_wrong_number(pages):
    """A page whose number is off in the 4th digit fails the check."""
    expl = pages["grpo", "en"]
    tensor, mask = expected("grpo", expl)["advantages"]
    rows = as_cells(tensor, mask)
    rows[0][1] *= 1.001
    with pytest.raises(AssertionError):
        assert_rows("advantages", as_cells(tensor, mask), rows)
    page = render_markdown(expl).replace(fmt(expl.value("loss").rows[0][0]), "0.5")
    with pytest.raises(AssertionError):
        assert_rows("loss", as_cells(*expected("grpo", expl)["loss"]), markdown_values(page)["loss"])


def test_examples_use_the_presets(pages):
    """What the pages say lmpo trains with is the preset: the clip range, the estimator, the aggregation."""
    for method in ("grpo", "dr_grpo", "rloo", "dapo", "gspo", "cispo", "reinforce_pp", "ppo"):
        expl = pages[method, "en"]
        assert expl.settings == RL_PRESETS[method].settings
        assert f"lmpo train {method}" in expl.commands
        sources = " ".join(v.source for v in expl.values())
        assert f"'{RL_PRESETS[method].settings['loss']}'" in sources
        assert f"clip_eps_high={RL_PRESETS[method].settings['clip_eps_high']!r}" in sources
    assert any(v.name == "kl" for v in pages["grpo", "en"].values())  # beta 0.04, k3 in the loss
    assert not any(v.name == "kl" for v in pages["dapo", "en"].values())  # beta 0


@pytest.mark.parametrize("method,shown", [("dpo", "beta=0.1, loss=dpo"), ("ipo", "beta=0.1, loss=ipo"),
                                          ("simpo", "beta=0.1, gamma=0.5, loss=simpo")])
def test_a_preference_page_shows_only_the_options_its_loss_reads(method, shown):
    """ipo's and simpo's pages listed gamma and label_smoothing, which ipo does not read."""
    page = render_markdown(explain(method, "en"))
    assert f"**Preset settings**: `{shown}`" in page, [line for line in page.splitlines() if "Preset" in line]
