"""Worked example of PPO with a critic: k1 reward penalty, GAE over a multi-turn row with masked
tool-output tokens, whitening, the clipped policy loss and the clipped value loss."""

from __future__ import annotations

import torch

from lmpo.algos import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, TOKEN_ADVANTAGES, clipped_value_loss, masked_whiten, token_rewards
from lmpo.teach.explain import diagrams
from lmpo.teach.explain import inputs as x
from lmpo.teach.explain.model import Explanation
from lmpo.teach.explain.page import Page
from lmpo.teach.explain.objective import aggregation_options, call_text, loss_options
from lmpo.teach.explain.rl_examples import ratio_step
from lmpo.teach.explain.settings import PAPERS, commands, preset_settings, rl_settings

FORMULA = ("δ_t = r_t + γV_{t+1} − V_t ,  A_t = Σ_l (γλ)^l δ_{t+l} ,  L = token_mean(−min(r·A, clip(r, 1−ε, 1+ε)·A))"
           " + c_v·token_mean(½·max((V − G)², (clip(V, V_old ± ε_v) − G)²))")


def ppo(lang: str) -> Explanation:
    s = rl_settings("ppo")
    page = Page("ppo", lang)
    rewards = x.tensor(x.PPO_REWARDS)
    mask, old, ref = x.mask_of(x.PPO_OLD_LOGPROBS), x.tensor(x.PPO_OLD_LOGPROBS), x.tensor(x.PPO_REF_LOGPROBS)
    kl = KL_ESTIMATORS.get("k1")(old, ref) * mask
    per_token = token_rewards(rewards, mask, kl=kl, beta=s["beta"])
    page.step("kl_reward.ppo", "r_t = −β·k1_t + [t = last]·R ,  k1_t = log π_old − log π_ref", [
        page.value("rewards", "R", rewards, given=True, per="sequence"),
        page.value("old_logprobs", "log π_old", old, given=True, mask=mask),
        page.value("ref_logprobs", "log π_ref", ref, given=True, mask=mask),
        page.value("k1", "k1", kl, mask=mask, source="KL_ESTIMATORS.get('k1')(log π_old, log π_ref)"),
        page.value("token_rewards", "r_t", per_token, mask=mask, source=f"token_rewards(R, mask, kl=k1, beta={s['beta']})"),
    ], beta=s["beta"])
    old_values = x.tensor(x.PPO_OLD_VALUES)
    adv, returns = TOKEN_ADVANTAGES.get("gae")(per_token, mask, values=old_values, gamma=s["gamma"], lam=s["gae_lambda"])
    page.step("gae", "δ_t = r_t + γ·V_{t+1} − V_t ,  A_t = δ_t + γλ·A_{t+1} ,  G_t = A_t + V_t", [
        page.value("old_values", "V_old", old_values, given=True, mask=mask),
        page.value("gae_advantages", "A_t", adv, mask=mask,
                   source=f"TOKEN_ADVANTAGES.get('gae')(gamma={s['gamma']}, lam={s['gae_lambda']})"),
        page.value("returns", "G_t", returns, mask=mask, source="TOKEN_ADVANTAGES.get('gae')"),
    ], gamma=s["gamma"], lam=s["gae_lambda"])
    unbiased = s["whiten_std"] == "sample"
    white = masked_whiten(adv, mask, eps=s["whiten_eps"], unbiased=unbiased) if s["whiten_advantages"] else adv
    page.step("whiten", "A ← (A − mean_batch A) / sqrt(var_batch A + eps)", [
        page.value("advantages", "A_t", white, mask=mask,
                   source=f"masked_whiten(A, mask, eps={s['whiten_eps']}, unbiased={unbiased})"),
    ], eps=s["whiten_eps"])
    logprobs = x.tensor(x.PPO_NEW_LOGPROBS).requires_grad_(True)
    ratio_step(page, "ppo", logprobs, old, mask)
    loss_fn = POLICY_LOSSES.get(s["loss"])
    token_loss, info = loss_fn(logprobs, old, white, mask, **loss_options(loss_fn, s))
    page.step("policy_loss.ppo_clip", "ℓ = −min(r·A, clip(r, 1−ε_low, 1+ε_high)·A)", [
        page.value("token_loss", "ℓ", token_loss, mask=mask,
                   source=call_text("POLICY_LOSSES", s["loss"], loss_options(loss_fn, s))),
        page.value("clipped", "clipped", info["clipped"], mask=mask, source="indicators['clipped']"),
    ], clip_eps_low=s["clip_eps_low"], clip_eps_high=s["clip_eps_high"], low=1 - s["clip_eps_low"],
        high=1 + s["clip_eps_high"])
    values = x.tensor(x.PPO_NEW_VALUES).requires_grad_(True)
    value_loss, value_info = clipped_value_loss(values, old_values, returns, mask, clip_eps_value=s["clip_eps_value"] or None)
    page.step("value_loss", "ℓ_v = ½·max((V − G)², (clip(V, V_old − ε_v, V_old + ε_v) − G)²)", [
        page.value("values", "V", values, given=True, mask=mask),
        page.value("value_loss", "ℓ_v", value_loss, mask=mask,
                   source=f"clipped_value_loss(V, V_old, G, mask, clip_eps_value={s['clip_eps_value']})"),
        page.value("value_clipped", "clipped", value_info["clipped"], mask=mask, source="indicators['clipped']"),
    ], clip=s["clip_eps_value"])
    aggregate = AGGREGATIONS.get(s["aggregation"])
    options = aggregation_options(aggregate, s)
    policy_loss, critic_loss = aggregate(token_loss, mask, **options), aggregate(value_loss, mask, **options)
    total = policy_loss + s["vf_coef"] * critic_loss
    source = call_text("AGGREGATIONS", s["aggregation"], options)
    page.step("ppo_total", "L = token_mean(ℓ) + c_v · token_mean(ℓ_v)", [
        page.value("policy_loss", "L_π", policy_loss, per="scalar", source=source),
        page.value("critic_loss", "L_v", critic_loss, per="scalar", source=source),
        page.value("loss", "L", total, per="scalar", source=f"L_π + {s['vf_coef']}·L_v"),
    ], vf_coef=s["vf_coef"])
    grad, value_grad = torch.autograd.grad(total, (logprobs, values))
    page.step("gradient.ppo", "∂L/∂log π_θ ,  ∂L/∂V ,  push = −sign(∂L/∂log π_θ)", [
        page.value("grad", "∂L/∂logπ", grad, mask=mask, source="torch.autograd.grad(L, log π_θ)"),
        page.value("push", "−sign", -torch.sign(grad), mask=mask, source="−sign(∂L/∂log π_θ)"),
        page.value("value_grad", "∂L/∂V", value_grad, mask=mask, source="torch.autograd.grad(L, V)"),
    ])
    page.diagram("surrogate_ppo", lambda path: diagrams.surrogate(path, "ppo", s),
                 clip_eps_low=s["clip_eps_low"], clip_eps_high=s["clip_eps_high"])
    page.diagram("gae_masked", lambda path: diagrams.gae_masked(path, s), gamma=s["gamma"], lam=s["gae_lambda"])
    return page.finish(formula=FORMULA, papers=PAPERS["ppo"], commands=commands("ppo"),
                       settings=preset_settings("ppo"), **s)
