"""Worked examples of the group methods (grpo, dr_grpo, rloo, dapo, gspo, cispo) and REINFORCE++.

One group of four completions goes through what `lmpo train NAME` computes: rewards, the
registered advantage estimator, token ratios, the registered policy loss, the KL term where the
preset has one, the registered aggregation, and autograd on the new log-probs.
"""

from __future__ import annotations

import torch

from lmpo.algos import (ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, TOKEN_ADVANTAGES, group_means,
                        groups_with_signal, masked_mean, overlong_penalty, token_rewards)
from lmpo.teach.explain.objective import (advantage_options, aggregation_options, call_text, loss_options,
                                          policy_objective)
from lmpo.teach.explain import diagrams
from lmpo.teach.explain import inputs as x
from lmpo.teach.explain.model import Explanation
from lmpo.teach.explain.page import Page
from lmpo.teach.explain.settings import PAPERS, commands, preset_settings, rl_settings


def clipped_sentence(page: Page, s: dict) -> dict[str, str]:
    """What a clipped token receives depends on the policy loss and on a KL term in the loss, so
    the sentence is put together from those parts of the settings, not written per page."""
    kl_in_loss = s["beta"] > 0 and s["kl_placement"] == "loss"
    return {"clipped": page.tx(f"step.gradient.clipped.{s['loss']}"),
            "kl": page.tx("step.gradient.clipped.kl", beta=s["beta"]) if kl_in_loss else ""}


def gradient_steps(page: Page, s: dict, loss, logprobs, mask) -> None:
    """Autograd on the new log-probs: the gradient and the direction each token is pushed."""
    (grad,) = torch.autograd.grad(loss, logprobs)
    page.step("gradient", "∂L/∂log π_θ(y_t) ;  push = −sign(∂L/∂log π_θ)", [
        page.value("grad", "∂L/∂logπ", grad, mask=mask, source="torch.autograd.grad(L, log π_θ)"),
        page.value("push", "−sign", -torch.sign(grad), mask=mask, source="−sign(∂L/∂log π_θ)"),
    ], **clipped_sentence(page, s))


def ratio_step(page: Page, method: str, logprobs, old, mask) -> None:
    rho = torch.where(mask.bool(), logprobs.detach() - old, 0.0)
    shown = {v.name for step in page.steps for v in step.values}
    values = [] if "old_logprobs" in shown else [page.value("old_logprobs", "log π_old", old, given=True, mask=mask)]
    values += [
        page.value("logprobs", "log π_θ", logprobs, given=True, mask=mask),
        page.value("log_ratio", "ρ", rho, mask=mask, source="log π_θ − log π_old"),
    ]
    if method == "gspo":
        seq = masked_mean(rho, mask, dim=-1)
        values += [page.value("seq_log_ratio", "(1/L_i)Σρ", seq, per="sequence", source="masked_mean(ρ, mask, dim=-1)"),
                   page.value("seq_ratio", "s_i", seq.exp(), per="sequence", source="exp(masked_mean(ρ))")]
        page.step("ratio.gspo", "s_i = exp((1/L_i) Σ_t ρ_{i,t})", values)
    else:
        values.append(page.value("ratio", "r", rho.exp() * mask, mask=mask, source="exp(ρ)"))
        page.step("ratio", "ρ = log π_θ − log π_old ,  r = exp(ρ)", values)


POLICY_FORMULAS = {
    "ppo_clip": "ℓ = −min(r·A, clip(r, 1−ε_low, 1+ε_high)·A)",
    "gspo": "ℓ_i = −min(s_i·A_i, clip(s_i, 1−ε_low, 1+ε_high)·A_i)",
    "cispo": "ℓ = −sg(clip(r, 1−ε_low, 1+ε_high))·A·log π_θ",
}
AGGREGATION_FORMULAS = {
    "seq_mean_token_mean": "L = (1/G) Σ_i (1/L_i) Σ_t ℓ_{i,t}",
    "token_mean": "L = Σ_{i,t} ℓ_{i,t} / Σ_i L_i",
    "seq_mean_token_sum_norm": "L = Σ_{i,t} ℓ_{i,t} / (G · L_max)",
}
ADVANTAGE_FORMULAS = {
    "grpo": "A_i = (R_i − mean_j R_j) / (std_j R_j + eps)",
    "dr_grpo": "A_i = R_i − mean_j R_j",
    "rloo": "A_i = R_i − (1/(G−1)) Σ_{j≠i} R_j",
}


def loss_steps(page: Page, s: dict, logprobs, old, advantages, mask, ref=None):
    """The policy loss, the KL term (where the preset puts it in the loss) and the aggregation."""
    token_loss, info, total, kl, loss = policy_objective(s, logprobs, old, advantages, mask, ref)
    fields = {k: s[k] for k in ("clip_eps_low", "clip_eps_high")}
    fields.update(low=1 - s["clip_eps_low"], high=1 + s["clip_eps_high"])
    page.step(f"policy_loss.{s['loss']}", POLICY_FORMULAS[s["loss"]], [
        page.value("token_loss", "ℓ", token_loss, mask=mask,
                   source=call_text("POLICY_LOSSES", s["loss"], loss_options(POLICY_LOSSES.get(s["loss"]), s))),
        page.value("clipped", "clipped", info["clipped"], mask=mask, source="indicators['clipped']"),
    ], **fields)
    if kl is not None:
        page.step("kl_in_loss", f"ℓ' = ℓ + β·{s['kl_estimator']}(log π_θ, log π_ref)", [
            page.value("ref_logprobs", "log π_ref", ref, given=True, mask=mask),
            page.value("kl", s["kl_estimator"], kl, mask=mask, source=f"KL_ESTIMATORS.get({s['kl_estimator']!r})"),
            page.value("token_loss_kl", "ℓ'", total, mask=mask, source="ℓ + β·kl"),
        ], beta=s["beta"], estimator=s["kl_estimator"])
    aggregate = AGGREGATIONS.get(s["aggregation"])
    options = aggregation_options(aggregate, s)
    page.step(f"aggregation.{s['aggregation']}", AGGREGATION_FORMULAS[s["aggregation"]], [
        page.value("loss", "L", loss, per="scalar", source=call_text("AGGREGATIONS", s["aggregation"], options)),
    ], **{"max_len": options.get("max_len", "")})
    return loss


def flat_group_step(page: Page, s: dict) -> None:
    """An all-equal group: the estimator gives 0 advantages, so the policy term gives 0 gradient."""
    rewards, ids = x.tensor(x.FLAT_REWARDS), torch.zeros(len(x.FLAT_REWARDS), dtype=torch.long)
    fn = ADVANTAGES.get(s["advantage"])
    adv = fn(rewards, ids, **advantage_options(fn, s))
    mask, old = x.mask_of(x.OLD_LOGPROBS), x.tensor(x.OLD_LOGPROBS)
    logprobs = x.tensor(x.NEW_LOGPROBS).requires_grad_(True)
    *_, loss = policy_objective({**s, "beta": 0.0}, logprobs, old, adv[:, None], mask)
    (grad,) = torch.autograd.grad(loss, logprobs)
    key = "flat_group.kl" if s["beta"] > 0 and s["kl_placement"] == "loss" else "flat_group"
    page.step(key, "R_1 = … = R_G  ⇒  A_i = 0  ⇒  ∂L_pg/∂log π_θ = 0", [
        page.value("flat_rewards", "R_i", rewards, given=True, per="sequence"),
        page.value("flat_advantages", "A_i", adv, per="sequence", source=f"ADVANTAGES.get({s['advantage']!r})"),
        page.value("flat_grad", "∂L_pg/∂logπ", grad, mask=mask, source="torch.autograd.grad(L_pg, log π_θ)"),
    ], beta=s["beta"])


def dapo_steps(page: Page, s: dict) -> None:
    """Dynamic sampling (drop groups without signal) and the soft overlong penalty."""
    rewards = x.tensor(x.REWARDS + x.FLAT_REWARDS)
    ids = torch.tensor([0] * len(x.REWARDS) + [1] * len(x.FLAT_REWARDS))
    page.step("dynamic_sampling", "keep_i = [max_{j∈g(i)} R_j > min_{j∈g(i)} R_j]", [
        page.value("batch_rewards", "R_i", rewards, given=True, per="sequence"),
        page.value("batch_groups", "group", ids.float(), given=True, per="sequence"),
        page.value("keep", "keep", groups_with_signal(rewards, ids).float(), per="sequence",
                   source="groups_with_signal(R, group_ids)"),
    ])
    max_len = s["max_len_norm"] or s["max_new_tokens"]
    lengths = torch.tensor(x.LENGTHS)
    page.step("overlong", "penalty = clamp(((L_max − L_cache) − L) / L_cache, −1, 0)", [
        page.value("lengths", "L", lengths.float(), given=True, per="sequence"),
        page.value("penalty", "penalty", overlong_penalty(lengths, max_len, s["overlong_cache"]), per="sequence",
                   source=f"overlong_penalty(L, max_len={max_len}, cache_len={s['overlong_cache']})"),
    ], max_len=max_len, cache=s["overlong_cache"], start=max_len - s["overlong_cache"])


def sequence_method(method: str, lang: str) -> Explanation:
    """grpo, dr_grpo, rloo, dapo, gspo, cispo: one advantage per completion, broadcast to its tokens."""
    s = rl_settings(method)
    page = Page(method, lang)
    rewards, ids = x.tensor(x.REWARDS), torch.zeros(len(x.REWARDS), dtype=torch.long)
    if method == "dapo":
        dapo_steps(page, s)
    fn = ADVANTAGES.get(s["advantage"])
    options = advantage_options(fn, s)
    adv = fn(rewards, ids, **options)
    page.step(f"advantages.{s['advantage']}", ADVANTAGE_FORMULAS[s["advantage"]], [
        page.value("rewards", "R_i", rewards, given=True, per="sequence"),
        page.value("group_mean", "mean_j R_j", group_means(rewards, ids), per="sequence", source="group_means(R, group_ids)"),
        page.value("advantages", "A_i", adv, per="sequence", source=call_text("ADVANTAGES", s["advantage"], options)),
    ], std=page.tx(f"word.std.{s['std']}"), advantage_eps=s["advantage_eps"])
    mask, old = x.mask_of(x.OLD_LOGPROBS), x.tensor(x.OLD_LOGPROBS)
    logprobs = x.tensor(x.NEW_LOGPROBS_GSPO if method == "gspo" else x.NEW_LOGPROBS).requires_grad_(True)
    ratio_step(page, method, logprobs, old, mask)
    loss = loss_steps(page, s, logprobs, old, adv[:, None], mask, ref=x.tensor(x.REF_LOGPROBS))
    gradient_steps(page, s, loss, logprobs, mask)
    if method in ("grpo", "dr_grpo", "rloo"):
        flat_group_step(page, s)
    add_rl_diagrams(page, method, s)
    return finish_rl(page, method, s)


def reinforce_pp(lang: str) -> Explanation:
    """REINFORCE++: token rewards with a k1 penalty, discounted returns, whitened over the batch."""
    method, s = "reinforce_pp", rl_settings("reinforce_pp")
    page = Page(method, lang)
    rewards = x.tensor(x.REWARDS)
    mask, old, ref = x.mask_of(x.OLD_LOGPROBS), x.tensor(x.OLD_LOGPROBS), x.tensor(x.REF_LOGPROBS)
    kl = KL_ESTIMATORS.get("k1")(old, ref) * mask
    per_token = token_rewards(rewards, mask, kl=kl, beta=s["beta"])
    page.step("kl_reward", "r_t = −β·k1_t + [t = last]·R_i ,  k1_t = log π_old − log π_ref", [
        page.value("rewards", "R_i", rewards, given=True, per="sequence"),
        page.value("old_logprobs", "log π_old", old, given=True, mask=mask),
        page.value("ref_logprobs", "log π_ref", ref, given=True, mask=mask),
        page.value("k1", "k1", kl, mask=mask, source="KL_ESTIMATORS.get('k1')(log π_old, log π_ref)"),
        page.value("token_rewards", "r_t", per_token, mask=mask, source=f"token_rewards(R, mask, kl=k1, beta={s['beta']})"),
    ], beta=s["beta"])
    adv, returns = TOKEN_ADVANTAGES.get("reinforce_pp")(per_token, mask, gamma=s["gamma"])
    page.step("advantages.reinforce_pp", "G_t = Σ_l γ^l r_{t+l} ,  A = (G − mean_batch G) / sqrt(var_batch G + eps)", [
        page.value("returns", "G_t", returns, mask=mask, source=f"TOKEN_ADVANTAGES.get('reinforce_pp')(gamma={s['gamma']})"),
        page.value("advantages", "A_t", adv, mask=mask, source=f"TOKEN_ADVANTAGES.get('reinforce_pp')(gamma={s['gamma']})"),
    ], gamma=s["gamma"])
    logprobs = x.tensor(x.NEW_LOGPROBS).requires_grad_(True)
    ratio_step(page, method, logprobs, old, mask)
    loss = loss_steps(page, s, logprobs, old, adv, mask)
    gradient_steps(page, s, loss, logprobs, mask)
    add_rl_diagrams(page, method, s)
    return finish_rl(page, method, s)


def add_rl_diagrams(page: Page, method: str, s: dict) -> None:
    eps = {"clip_eps_low": s["clip_eps_low"], "clip_eps_high": s["clip_eps_high"]}
    page.diagram(f"surrogate_{method}", lambda path: diagrams.surrogate(path, method, s), **eps)
    if method in ("grpo", "dr_grpo", "rloo"):
        page.diagram("group_normalisation", diagrams.group_normalisation)
    if method in ("grpo", "dapo"):
        page.diagram("zero_signal", diagrams.zero_signal)
    if method in ("dr_grpo", "dapo", "grpo"):
        page.diagram("aggregation", diagrams.aggregation)
    if method == "reinforce_pp":
        page.diagram("token_returns", lambda path: diagrams.token_returns(path, s), beta=s["beta"])


RL_FORMULAS = {
    "grpo": "L = (1/G) Σ_i (1/L_i) Σ_t −min(r·A_i, clip(r, 1−ε, 1+ε)·A_i) + β·k3 ,  A_i = (R_i − mean R)/(std R + eps)",
    "dr_grpo": "L = Σ_{i,t} −min(r·A_i, clip(r, 1−ε, 1+ε)·A_i) / (G·L_max) ,  A_i = R_i − mean R",
    "rloo": "A_i = R_i − (1/(G−1)) Σ_{j≠i} R_j ,  ℓ = −min(r·A_i, clip(r, 1−ε, 1+ε)·A_i)",
    "dapo": "L = Σ_{i,t} −min(r·A_i, clip(r, 1−ε_low, 1+ε_high)·A_i) / Σ_i L_i ,  i ∈ g: max R_g > min R_g",
    "gspo": "s_i = exp((1/L_i) Σ_t ρ_{i,t}) ,  L = (1/G) Σ_i −min(s_i·A_i, clip(s_i, 1−ε_low, 1+ε_high)·A_i)",
    "cispo": "L = Σ_{i,t} −sg(clip(r, 1−ε_low, 1+ε_high))·A_i·log π_θ(y_{i,t}) / Σ_i L_i",
    "reinforce_pp": "r_t = −β·k1_t + [t = last]·R ,  A = whiten_batch(Σ_l γ^l r_{t+l}) ,  ℓ = −min(r·A, clip(r)·A)",
}


def finish_rl(page: Page, method: str, s: dict) -> Explanation:
    return page.finish(formula=RL_FORMULAS[method], papers=PAPERS[method], commands=commands(method),
                       settings=preset_settings(method), **s)
