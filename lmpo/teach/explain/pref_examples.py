"""Worked examples of the offline preference losses (dpo, ipo, simpo), the Bradley–Terry reward
model and the k1/k2/k3 KL estimators, computed by `lmpo.algos`."""

from __future__ import annotations

import inspect

import torch

from lmpo.algos import KL_ESTIMATORS, PREFERENCE_LOSSES, bradley_terry_loss, token_logprobs
from lmpo.teach.explain import diagrams
from lmpo.teach.explain import inputs as x
from lmpo.teach.explain.model import Explanation
from lmpo.teach.explain.page import Page
from lmpo.teach.explain.settings import (PAPERS, RL_METHODS, commands, preference_settings, reward_model_settings,
                                         rl_settings)

PREFERENCE_FORMULAS = {
    "dpo": "h = β·[(log π_θ(y_w) − log π_ref(y_w)) − (log π_θ(y_l) − log π_ref(y_l))] ,  L = −log σ(h)",
    "ipo": "d = (log π_θ(y_w) − log π_ref(y_w))/|y_w| − (log π_θ(y_l) − log π_ref(y_l))/|y_l| ,  L = (d − 1/(2β))²",
    "simpo": "L = −log σ(β·(log π_θ(y_w)/|y_w| − log π_θ(y_l)/|y_l|) − γ)",
}
REWARD_FORMULAS = {
    "dpo": "reward(y) = β·(log π_θ(y) − log π_ref(y))",
    "ipo": "reward(y) = β·(log π_θ(y) − log π_ref(y)) / |y|",
    "simpo": "reward(y) = β·log π_θ(y) / |y|",
}


def preference(method: str, lang: str) -> Explanation:
    reads = inspect.signature(PREFERENCE_LOSSES.get(method)).parameters  # only the options this loss takes
    s = {**{k: v for k, v in preference_settings().items() if k in reads}, "loss": method}
    page = Page(method, lang)
    chosen = x.tensor(x.CHOSEN_LOGPS).requires_grad_(True)
    rejected = x.tensor(x.REJECTED_LOGPS).requires_grad_(True)
    ref_chosen, ref_rejected = x.tensor(x.REF_CHOSEN_LOGPS), x.tensor(x.REF_REJECTED_LOGPS)
    lengths = {"chosen_lengths": x.tensor(x.CHOSEN_LENGTHS), "rejected_lengths": x.tensor(x.REJECTED_LENGTHS)}
    given = [page.value("chosen_logps", "log π_θ(y_w)", chosen, given=True, per="pair"),
             page.value("rejected_logps", "log π_θ(y_l)", rejected, given=True, per="pair")]
    if method != "simpo":
        given += [page.value("ref_chosen_logps", "log π_ref(y_w)", ref_chosen, given=True, per="pair"),
                  page.value("ref_rejected_logps", "log π_ref(y_l)", ref_rejected, given=True, per="pair")]
    if method != "dpo":
        given += [page.value("chosen_lengths", "|y_w|", lengths["chosen_lengths"], given=True, per="pair"),
                  page.value("rejected_lengths", "|y_l|", lengths["rejected_lengths"], given=True, per="pair")]
    page.step(f"pairs.{method}", "(x, y_w, y_l)", given)
    fn = PREFERENCE_LOSSES.get(method)
    options = {k: s[k] for k in ("beta", "gamma") if k in s}
    loss, figures = fn(chosen, rejected, ref_chosen, ref_rejected, **lengths, **options)
    source = f"PREFERENCE_LOSSES.get({method!r})({', '.join(f'{k}={v!r}' for k, v in options.items())})"
    page.step(f"implicit_rewards.{method}", REWARD_FORMULAS[method], [
        page.value("chosen_reward", "reward(y_w)", figures["chosen_reward"], per="pair", source=source + "[1]['chosen_reward']"),
        page.value("rejected_reward", "reward(y_l)", figures["rejected_reward"], per="pair", source=source + "[1]['rejected_reward']"),
        page.value("margin", "margin", figures["margin"], per="pair", source=source + "[1]['margin']"),
        page.value("accuracy", "acc", figures["accuracy"], per="pair", source=source + "[1]['accuracy']"),
    ], **s)
    mean = loss.mean()
    page.step(f"loss.{method}", PREFERENCE_FORMULAS[method], [
        page.value("pair_loss", "L_pair", loss, per="pair", source=source + "[0]"),
        page.value("loss", "L", mean, per="scalar", source="L_pair.mean()"),
    ], **s, target=1 / (2 * s["beta"]))
    grad_w, grad_l = torch.autograd.grad(mean, (chosen, rejected))
    page.step(f"gradient.{method}", "∂L/∂log π_θ(y_w) ,  ∂L/∂log π_θ(y_l)", [
        page.value("grad_chosen", "∂L/∂logπ(y_w)", grad_w, per="pair", source="torch.autograd.grad(L, log π_θ(y_w))"),
        page.value("grad_rejected", "∂L/∂logπ(y_l)", grad_l, per="pair", source="torch.autograd.grad(L, log π_θ(y_l))"),
    ], **s)
    page.diagram(f"preference_{method}", lambda path: diagrams.preference(path, method, s), **s)
    return page.finish(formula=PREFERENCE_FORMULAS[method], papers=PAPERS[method], commands=commands(method),
                       settings=s, **s)


def reward_model(lang: str) -> Explanation:
    s = reward_model_settings()
    page = Page("reward_model", lang)
    chosen = x.tensor(x.CHOSEN_SCORES).requires_grad_(True)
    rejected = x.tensor(x.REJECTED_SCORES).requires_grad_(True)
    loss, figures = bradley_terry_loss(chosen, rejected, margin=s["margin"], center_coef=s["center_coef"])
    source = f"bradley_terry_loss(r_w, r_l, margin={s['margin']}, center_coef={s['center_coef']})"
    page.step("bt_loss", "L = −log σ(r_w − r_l − m) + c·(r_w + r_l)²", [
        page.value("chosen_scores", "r_w", chosen, given=True, per="pair"),
        page.value("rejected_scores", "r_l", rejected, given=True, per="pair"),
        page.value("margin", "r_w − r_l", figures["margin"], per="pair", source=source + "[1]['margin']"),
        page.value("accuracy", "acc", figures["accuracy"], per="pair", source=source + "[1]['accuracy']"),
        page.value("pair_loss", "L_pair", loss, per="pair", source=source + "[0]"),
        page.value("loss", "L", loss.mean(), per="scalar", source="L_pair.mean()"),
    ], **s)
    grad_w, grad_l = torch.autograd.grad(loss.mean(), (chosen, rejected))
    page.step("gradient.reward_model", "∂L/∂r_w = −σ(−(r_w − r_l − m))/B + …", [
        page.value("grad_chosen", "∂L/∂r_w", grad_w, per="pair", source="torch.autograd.grad(L, r_w)"),
        page.value("grad_rejected", "∂L/∂r_l", grad_l, per="pair", source="torch.autograd.grad(L, r_l)"),
    ])
    demo = {"margin": x.RM_MARGIN_DEMO, "center_coef": x.RM_CENTER_DEMO}
    demo_loss, _ = bradley_terry_loss(chosen.detach(), rejected.detach(), **demo)
    page.step("bt_options", "L = −log σ(r_w − r_l − m) + c·(r_w + r_l)²", [
        page.value("demo_pair_loss", "L_pair", demo_loss, per="pair",
                   source=f"bradley_terry_loss(r_w, r_l, margin={demo['margin']}, center_coef={demo['center_coef']})[0]"),
    ], **demo)
    page.diagram("bradley_terry", diagrams.bradley_terry, **demo)
    return page.finish(formula="L = −log σ(r(x, y_w) − r(x, y_l) − m) + c·(r_w + r_l)²", papers=PAPERS["reward_model"],
                       commands=commands("reward_model"), settings=s, **s)


def kl(lang: str) -> Explanation:
    page = Page("kl", lang)
    policy_logits, ref_logits = x.tensor(x.POLICY_LOGITS), x.tensor(x.REFERENCE_LOGITS)
    vocab = torch.arange(len(x.POLICY_LOGITS))
    logprobs = token_logprobs(policy_logits.expand(len(vocab), -1), vocab).requires_grad_(True)
    ref = token_logprobs(ref_logits.expand(len(vocab), -1), vocab)
    probs = logprobs.detach().exp()
    page.step("kl_tokens", "log π(y) = log softmax(z)[y]", [
        page.value("policy_logits", "z_θ", policy_logits, given=True, per="entry"),
        page.value("reference_logits", "z_ref", ref_logits, given=True, per="entry"),
        page.value("logprobs", "log π_θ(y)", logprobs, per="entry", source="token_logprobs(z_θ, y)"),
        page.value("ref_logprobs", "log π_ref(y)", ref, per="entry", source="token_logprobs(z_ref, y)"),
        page.value("probs", "π_θ(y)", probs, per="entry", source="exp(log π_θ(y))"),
    ])
    estimates = {name: KL_ESTIMATORS.get(name)(logprobs, ref) for name in ("k1", "k2", "k3")}
    page.step("kl_estimators", "κ = log π_ref − log π_θ ;  k1 = −κ ,  k2 = κ²/2 ,  k3 = exp(κ) − 1 − κ", [
        page.value(name, name, value, per="entry", source=f"KL_ESTIMATORS.get({name!r})(log π_θ, log π_ref)")
        for name, value in estimates.items()
    ])
    exact = torch.distributions.kl_divergence(torch.distributions.Categorical(logits=policy_logits),
                                              torch.distributions.Categorical(logits=ref_logits))
    page.step("kl_expectations", "E_{y∼π_θ}[k] = Σ_y π_θ(y)·k(y) ,  KL(π_θ‖π_ref) = Σ_y π_θ(y)·log(π_θ(y)/π_ref(y))", [
        page.value("exact_kl", "KL", exact, per="scalar", source="torch.distributions.kl_divergence"),
        *[page.value(f"mean_{name}", f"E[{name}]", (probs * value.detach()).sum(), per="scalar",
                     source=f"Σ_y π_θ(y)·{name}(y)") for name, value in estimates.items()],
    ])
    grads = {name: torch.autograd.grad(value.sum(), logprobs)[0] for name, value in estimates.items()}
    page.step("kl_gradients", "∂k/∂log π_θ(y):  k1 → 1 ,  k2 → −κ ,  k3 → 1 − exp(κ)", [
        page.value(f"grad_{name}", f"∂{name}/∂logπ", grad, per="entry", source=f"torch.autograd.grad({name}, log π_θ)")
        for name, grad in grads.items()
    ])
    page.diagram("kl_estimators", diagrams.kl_estimators)
    return page.finish(formula="k1 = −κ ,  k2 = κ²/2 ,  k3 = exp(κ) − 1 − κ ,  κ = log π_ref(y) − log π_θ(y),  y ∼ π_θ",
                       papers=PAPERS["kl"], commands=commands("kl"), settings=kl_presets(),
                       **{f"{m}_beta": rl_settings(m)["beta"] for m in ("grpo", "ppo", "reinforce_pp")})


def kl_presets() -> dict:
    """The presets that hold a reference model, and how they use the KL (a reward penalty is always k1)."""
    out = {}
    for method in RL_METHODS:
        s = rl_settings(method)
        if s["beta"] > 0:
            estimator = s["kl_estimator"] if s["kl_placement"] == "loss" else "k1"
            out[method] = f"beta={s['beta']}, {estimator}, kl_placement={s['kl_placement']}"
    return out
