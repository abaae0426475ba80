"""Figures drawn by evaluating the library's own functions on grids (matplotlib, Agg, PNG).

Axis labels are formulas, the same in every language; each page's caption says what to see.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from lmpo.algos import (ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, PREFERENCE_LOSSES,  # noqa: E402
                        TOKEN_ADVANTAGES, bradley_terry_loss, token_rewards)
from lmpo.teach.explain import inputs as x  # noqa: E402
from lmpo.teach.explain.objective import advantage_options, policy_objective  # noqa: E402
from lmpo.teach.explain.settings import rl_settings  # noqa: E402

SIGNS = ((1.0, "A = +1"), (-1.0, "A = −1"))


def _save(fig, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=80, metadata={"Software": None})
    plt.close(fig)


def surrogate_curves(loss: str, options: dict, ratios: torch.Tensor, advantage: float):
    """(loss, ∂loss/∂log π) of one token with ratio r and advantage A, from the registered loss."""
    logprobs = ratios.log().unsqueeze(1).requires_grad_(True)
    zeros, ones = torch.zeros_like(logprobs), torch.ones_like(logprobs)
    values, _ = POLICY_LOSSES.get(loss)(logprobs, zeros, torch.full_like(zeros, advantage), ones, **options)
    (grad,) = torch.autograd.grad(values.sum(), logprobs)
    return values.detach().squeeze(1), grad.squeeze(1)


def surrogate_variants(method: str, s: dict) -> tuple[list[tuple[str, str, dict]], tuple[float, float]]:
    """The curves a method's page compares, and the range of the ratio."""
    eps = {"clip_eps_low": s["clip_eps_low"], "clip_eps_high": s["clip_eps_high"]}
    name = f"{s['loss']} ε {s['clip_eps_low']:g}/{s['clip_eps_high']:g}"
    if method == "gspo":
        return [(name + " (s = sequence ratio)", "gspo", eps)], (1 - 6 * s["clip_eps_low"], 1 + 6 * s["clip_eps_high"])
    if method == "cispo":
        dapo = rl_settings("dapo")
        ppo = {"clip_eps_low": dapo["clip_eps_low"], "clip_eps_high": dapo["clip_eps_high"]}
        return [(name, "cispo", eps), (f"ppo_clip ε {ppo['clip_eps_low']:g}/{ppo['clip_eps_high']:g} (dapo)",
                                       "ppo_clip", ppo)], (0.2, 2.0)
    if method == "dapo":
        symmetric = {"clip_eps_low": s["clip_eps_low"], "clip_eps_high": s["clip_eps_low"]}
        return [(name + " (clip-higher)", "ppo_clip", eps),
                (f"ppo_clip ε {s['clip_eps_low']:g}/{s['clip_eps_low']:g}", "ppo_clip", symmetric)], (0.4, 1.8)
    if method == "ppo":
        dual = {**eps, "dual_clip": x.DUAL_CLIP_DEMO}
        return [(name, "ppo_clip", eps), (f"{name}, dual-clip c = {x.DUAL_CLIP_DEMO:g}", "ppo_clip", dual)], (0.05, 4.5)
    return [(name, "ppo_clip", eps)], (0.4, 1.8)


def surrogate(path: str, method: str, s: dict) -> None:
    """Loss and gradient of one token against the ratio, for A > 0 and A < 0."""
    variants, (lo, hi) = surrogate_variants(method, s)
    ratios = torch.linspace(lo, hi, 401, dtype=torch.float64)
    fig, axes = plt.subplots(2, 2, figsize=(9, 6), sharex=True)
    for row, (sign, sign_label) in enumerate(SIGNS):
        for label, loss, options in variants:
            values, grad = surrogate_curves(loss, options, ratios, sign)
            axes[row, 0].plot(ratios, values, label=label)
            axes[row, 1].plot(ratios, grad, label=label)
        axes[row, 0].set_ylabel(f"ℓ   ({sign_label})")
        axes[row, 1].set_ylabel(f"∂ℓ/∂log π   ({sign_label})")
    for ax in axes.flat:
        ax.axvline(1.0, color="grey", lw=0.6, ls=":")
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("r = π_θ / π_old" if method != "gspo" else "s = exp(mean_t ρ_t)")
    axes[0, 0].legend(fontsize=8)
    _save(fig, path)


GROUPS = ([0.9, 0.6, 0.2, 0.0], [1.0, 0.0, 0.0, 0.0], [0.55, 0.5, 0.5, 0.45])


def group_normalisation(path: str) -> None:
    """grpo, dr_grpo and rloo advantages of the same three groups (registered estimators, defaults)."""
    rewards = torch.tensor([r for g in GROUPS for r in g], dtype=torch.float64)
    ids = torch.tensor([i for i, g in enumerate(GROUPS) for _ in g])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [1, 3]})
    positions = list(range(len(rewards)))
    axes[0].bar(positions, rewards.tolist(), color="grey")
    axes[0].set_title("R_i")
    for k, name in enumerate(("grpo", "dr_grpo", "rloo")):
        fn = ADVANTAGES.get(name)
        adv = fn(rewards, ids, **advantage_options(fn, rl_settings(name)))
        axes[1].bar([p + (k - 1) * 0.27 for p in positions], adv.tolist(), width=0.27, label=name)
    axes[1].set_title("A_i")
    for ax in axes:
        ax.set_xticks(positions, [f"g{int(g) + 1}·y{j % 4 + 1}" for j, g in enumerate(ids)], rotation=60, fontsize=7)
        ax.axhline(0, color="black", lw=0.6)
        ax.grid(alpha=0.3, axis="y")
    axes[1].legend(fontsize=8)
    _save(fig, path)


def zero_signal(path: str) -> None:
    """|∂L/∂log π| per completion for a group with signal and one whose rewards are all equal
    (the grpo preset's advantages, policy loss and aggregation, without its KL term; autograd)."""
    s = {**rl_settings("grpo"), "beta": 0.0}
    rewards = torch.tensor(x.REWARDS + x.FLAT_REWARDS)
    ids = torch.tensor([0] * 4 + [1] * 4)
    fn = ADVANTAGES.get(s["advantage"])
    adv = fn(rewards, ids, **advantage_options(fn, s))
    old = torch.cat([x.tensor(x.OLD_LOGPROBS)] * 2)
    mask = torch.cat([x.mask_of(x.OLD_LOGPROBS)] * 2)
    logprobs = torch.cat([x.tensor(x.NEW_LOGPROBS)] * 2).requires_grad_(True)
    *_, loss = policy_objective(s, logprobs, old, adv[:, None], mask)
    (grad,) = torch.autograd.grad(loss, logprobs)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    names = [f"g{int(g) + 1}·y{j % 4 + 1}" for j, g in enumerate(ids)]
    axes[0].bar(names, adv.tolist(), color=["tab:blue"] * 4 + ["tab:red"] * 4)
    axes[0].set_title("A_i (grpo)")
    axes[1].bar(names, grad.abs().sum(1).tolist(), color=["tab:blue"] * 4 + ["tab:red"] * 4)
    axes[1].set_title("Σ_t |∂L/∂log π_θ(y_t)|")
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=60, labelsize=7)
        ax.axhline(0, color="black", lw=0.6)
    _save(fig, path)


def aggregation(path: str) -> None:
    """The weight ∂L/∂ℓ_{i,t} of every token of completions of length 2, 4 and 8 under each
    registered aggregation (autograd), with L_max = 8."""
    lengths = (2, 4, 8)
    mask = torch.tensor([[1.0] * n + [0.0] * (8 - n) for n in lengths])
    fig, ax = plt.subplots(figsize=(8, 3.4))
    for k, name in enumerate(("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")):
        token_loss = torch.ones_like(mask, requires_grad=True)
        (weight,) = torch.autograd.grad(AGGREGATIONS.get(name)(token_loss, mask, max_len=8), token_loss)
        ax.bar([i + (k - 1) * 0.27 for i in range(len(lengths))], weight[:, 0].tolist(), width=0.27, label=name)
    ax.set_xticks(range(len(lengths)), [f"L_i = {n}" for n in lengths])
    ax.set_ylabel("∂L/∂ℓ_{i,t}")  # a formula only: the zh page shows the same plot
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    _save(fig, path)


GAE_MASK = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
GAE_VALUES = [0.3, 0.35, 0.4, 9.0, 9.0, 9.0, 0.5, 0.6, 0.7, 0.85]  # 9.0 on tool tokens: never read


def gae_masked(path: str, s: dict) -> None:
    """GAE over a multi-turn row whose tool-output tokens have mask 0 (the registered `gae`)."""
    mask = torch.tensor([GAE_MASK])
    values = torch.tensor([GAE_VALUES])
    rewards = token_rewards(torch.tensor([1.0]), mask)
    adv, returns = TOKEN_ADVANTAGES.get("gae")(rewards, mask, values=values, gamma=s["gamma"], lam=s["gae_lambda"])
    t = torch.arange(1, len(GAE_MASK) + 1)
    keep = mask[0].bool()
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for lo in (t[~keep] - 0.5).tolist():
        ax.axvspan(lo, lo + 1, color="0.85", lw=0)
    ax.plot(t[keep], values[0][keep], "o-", label="V_t (critic)")
    ax.plot(t[keep], adv[0][keep], "s-", label=f"A_t (gae, γ {s['gamma']:g}, λ {s['gae_lambda']:g})")
    ax.plot(t[keep], returns[0][keep], "^-", label="G_t = A_t + V_t")
    ax.bar(t.tolist(), rewards[0].tolist(), width=0.25, color="tab:green", alpha=0.4, label="r_t", zorder=0)
    ax.set_xticks(t, [f"t{i}" if m else "obs" for i, m in zip(t.tolist(), GAE_MASK)])
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    _save(fig, path)


def token_returns(path: str, s: dict) -> None:
    """REINFORCE++ on the example group: returns per token and the batch-whitened advantages."""
    mask = x.mask_of(x.OLD_LOGPROBS)
    kl = KL_ESTIMATORS.get("k1")(x.tensor(x.OLD_LOGPROBS), x.tensor(x.REF_LOGPROBS)) * mask
    rewards = token_rewards(x.tensor(x.REWARDS), mask, kl=kl, beta=s["beta"])
    adv, returns = TOKEN_ADVANTAGES.get("reinforce_pp")(rewards, mask, gamma=s["gamma"])
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True)
    for i in range(mask.shape[0]):
        keep = mask[i].bool()
        steps = torch.arange(1, int(keep.sum()) + 1)
        axes[0].plot(steps, returns[i][keep], "o-", label=f"y{i + 1}")
        axes[1].plot(steps, adv[i][keep], "o-", label=f"y{i + 1}")
    axes[0].set_title("G_t")
    axes[1].set_title("A_t = whiten_batch(G)")
    for ax in axes:
        ax.set_xlabel("t")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    _save(fig, path)


def kl_estimators(path: str) -> None:
    """k1, k2, k3 and their gradients against κ = log π_ref − log π_θ (registered estimators)."""
    kappa = torch.linspace(-3, 3, 301, dtype=torch.float64)
    logprobs = torch.zeros_like(kappa, requires_grad=True)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for name in ("k1", "k2", "k3"):
        value = KL_ESTIMATORS.get(name)(logprobs, kappa)
        (grad,) = torch.autograd.grad(value.sum(), logprobs)
        axes[0].plot(kappa, value.detach(), label=name)
        axes[1].plot(kappa, grad, label=name)
    axes[0].set_ylabel("k(κ)")
    axes[1].set_ylabel("∂k/∂log π_θ")
    for ax in axes:
        ax.set_xlabel("κ = log π_ref − log π_θ")
        ax.axhline(0, color="black", lw=0.6)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _save(fig, path)


PREFERENCE_RANGES = {"dpo": (-6.0, 6.0), "ipo": (-0.5, 1.5), "simpo": (-3.0, 4.0)}


def preference_curves(method: str, s: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(margin, L, ∂L/∂margin) of the registered preference loss on a grid of margins, where
    margin = reward(y_w) − reward(y_l) is the loss's own reported margin (β times the log-ratio
    difference, in reward units)."""
    lo, hi = PREFERENCE_RANGES[method]
    margin = torch.linspace(lo, hi, 301, dtype=torch.float64, requires_grad=True)
    # one-token completions, zero reference: each loss's reported margin is beta * chosen_logps,
    # so chosen_logps = margin / beta, and autograd through it differentiates w.r.t. the margin
    chosen = margin / s["beta"]
    zeros, ones = torch.zeros_like(chosen), torch.ones_like(chosen)
    options = {"beta": s["beta"], **({"gamma": s["gamma"]} if method == "simpo" else {})}
    loss, figures = PREFERENCE_LOSSES.get(method)(chosen, zeros, zeros, zeros, chosen_lengths=ones,
                                                   rejected_lengths=ones, **options)
    (grad,) = torch.autograd.grad(loss.sum(), margin)
    return figures["margin"], loss.detach(), grad


def preference(path: str, method: str, s: dict) -> None:
    """The registered preference loss and ∂L/∂margin against the implicit-reward margin."""
    margin, loss, grad = preference_curves(method, s)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    axes[0].plot(margin, loss, label=method)
    axes[1].plot(margin, grad, label=method)
    axes[0].set_ylabel("L")
    axes[1].set_ylabel("∂L/∂margin")
    for ax in axes:
        ax.set_xlabel("margin = reward(y_w) − reward(y_l)")
        ax.axhline(0, color="black", lw=0.6)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _save(fig, path)


def bradley_terry(path: str) -> None:
    """The Bradley–Terry loss and its gradient against r_w − r_l, without and with a margin m."""
    diff = torch.linspace(-5, 5, 301, dtype=torch.float64)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for m in (0.0, x.RM_MARGIN_DEMO):
        chosen = diff.clone().requires_grad_(True)
        loss, _ = bradley_terry_loss(chosen, torch.zeros_like(diff), margin=m)
        (grad,) = torch.autograd.grad(loss.sum(), chosen)
        axes[0].plot(diff, loss.detach(), label=f"m = {m:g}")
        axes[1].plot(diff, grad, label=f"m = {m:g}")
    axes[0].set_ylabel("L")
    axes[1].set_ylabel("∂L/∂r_w")
    for ax in axes:
        ax.set_xlabel("r_w − r_l")
        ax.axhline(0, color="black", lw=0.6)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    _save(fig, path)
