"""Claims about group-relative advantages: which groups carry signal, and how much."""

from __future__ import annotations

import copy
import math

import torch

from lmpo.algos import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from lmpo.teach.factcheck import plots
from lmpo.teach.factcheck.context import Context
from lmpo.teach.factcheck.core import DEPENDS, FAILS, HOLDS, Claim, Measured, Verdict

GROUP = 8


# --- 2. an all-equal group gives no gradient at beta = 0 ---------------------------------------

def _group_gradients(ctx: Context) -> Measured:
    """Gradient norms of the GRPO objective for one sampled group, through the registry's grpo,
    ppo_clip, seq_mean_token_mean and k3, on a freshly initialised model of the `tiny` preset."""
    from lmpo.envs import make_task
    from lmpo.envs.data.chat import encode_start
    from lmpo.models import completion_outputs, load_model, load_tokenizer
    from lmpo.rollout import SamplingParams, left_pad
    from lmpo.rollout.engine import generate
    from lmpo.trainers.presets import rl_preset

    beta = float(rl_preset("grpo").settings["beta"])
    tokenizer = load_tokenizer(ctx.model)
    policy = load_model(ctx.model, tokenizer, seed=ctx.seed, keep_dropout=False)
    same = copy.deepcopy(policy).requires_grad_(False)
    other = load_model(ctx.model, tokenizer, seed=ctx.seed + 1, keep_dropout=False).requires_grad_(False)
    problem = make_task(ctx.task).train_problems(1, ctx.seed)[0]
    prompt = encode_start(tokenizer, problem.prompt)
    rollout = generate(policy, [prompt] * GROUP, SamplingParams(1.0, max_new_tokens=8),
                       eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                       generator=torch.Generator().manual_seed(ctx.seed))
    prompt_ids, prompt_mask = left_pad(rollout.prompt_ids, tokenizer.pad_token_id)
    inputs = (prompt_ids, prompt_mask, rollout.completion_ids)
    mask, old = rollout.loss_mask, rollout.logprobs
    group_ids = torch.zeros(GROUP, dtype=torch.long)

    def grad_norm(rewards: torch.Tensor, beta: float, reference=None) -> float:
        policy.zero_grad(set_to_none=True)
        logprobs = completion_outputs(policy, *inputs).logprobs
        advantages = ADVANTAGES.get("grpo")(rewards, group_ids)[:, None].expand_as(mask)
        token_loss, _ = POLICY_LOSSES.get("ppo_clip")(logprobs, old, advantages, mask)
        if beta:
            with torch.no_grad():
                ref = completion_outputs(reference, *inputs).logprobs
            kl = KL_ESTIMATORS.get("k3")(logprobs, ref)
            token_loss = token_loss + beta * torch.where(mask.bool(), kl, torch.zeros_like(kl))
        AGGREGATIONS.get("seq_mean_token_mean")(token_loss, mask).backward()
        grads = [p.grad for p in policy.parameters() if p.grad is not None]
        return math.sqrt(sum(float(g.square().sum()) for g in grads))

    all_right, all_wrong = torch.ones(GROUP), torch.zeros(GROUP)
    mixed = torch.tensor([1.0, 0.0] * (GROUP // 2))
    values = {"beta": beta, "group": GROUP,
              "grad_beta0": max(grad_norm(all_right, 0.0), grad_norm(all_wrong, 0.0)),
              "grad_beta_ref_is_policy": grad_norm(all_right, beta, same),
              "grad_beta_ref_differs": grad_norm(all_right, beta, other),
              "grad_mixed_rewards": grad_norm(mixed, 0.0)}
    return Measured(values)


def _judge_group_gradients(v: dict, limits: dict) -> Verdict:
    if v["grad_mixed_rewards"] <= limits["tol"]:
        return Verdict(DEPENDS, "no_control")
    if v["grad_beta0"] > limits["tol"]:
        return Verdict(FAILS, "gradient_at_beta0")
    if v["grad_beta_ref_differs"] <= limits["tol"]:
        return Verdict(FAILS, "no_kl_gradient")
    return Verdict(HOLDS, "kl_only_when_moved")


ZERO_SIGNAL = Claim(
    name="zero_var_no_gradient", fast=True,
    papers=("DeepSeekMath (GRPO), Shao et al. 2024, arXiv:2402.03300", "DAPO, Yu et al. 2025, arXiv:2503.14476"),
    text="A group whose rewards are all equal (all right or all wrong) gives zero policy gradient when β = 0 — "
         "and not when β > 0.",
    criterion="Autograd through lmpo's grpo advantages, ppo_clip loss, seq_mean_token_mean and k3 on a sampled "
              "group of {group_size:g}. Holds if the gradient norm is ≤ {tol:g} for equal rewards at β = 0 and "
              "> {tol:g} at β > 0 with a reference that differs from the policy (and > {tol:g} for mixed rewards, "
              "the control).",
    summary="‖g‖ β=0: {grad_beta0:.3g}; β={beta:g}, ref = policy: {grad_beta_ref_is_policy:.3g}; "
            "β={beta:g}, ref ≠ policy: {grad_beta_ref_differs:.3g}; mixed rewards: {grad_mixed_rewards:.3g}",
    notes={"kl_only_when_moved": "At β = 0 the gradient is exactly {grad_beta0:g}: all advantages are 0. At β > 0 "
                                 "only the KL term pulls, and only once the policy differs from its reference: "
                                 "with the reference equal to the policy (the first step) k3's gradient is "
                                 "also {grad_beta_ref_is_policy:.3g}.",
           "gradient_at_beta0": "Equal rewards still gave a gradient of {grad_beta0:.3g} at β = 0.",
           "no_kl_gradient": "At β > 0 the KL term gave no gradient ({grad_beta_ref_differs:.3g}).",
           "no_control": "The control (mixed rewards) gave no gradient either: the measurement says nothing."},
    limits={"tol": 1e-12, "group_size": GROUP},
    measure=_group_gradients, judge=_judge_group_gradients,
)


# --- RLOO's leave-one-out advantages ------------------------------------------------------------

def _rloo_identity(ctx: Context) -> Measured:
    gen = torch.Generator().manual_seed(ctx.seed)
    sizes = [2, 3, 4, 5, 8, 16]
    rewards = torch.cat([torch.rand(k, generator=gen, dtype=torch.float64) for k in sizes])
    group_ids = torch.cat([torch.full((k,), i) for i, k in enumerate(sizes)])
    rloo = ADVANTAGES.get("rloo")(rewards, group_ids)
    centered = ADVANTAGES.get("dr_grpo")(rewards, group_ids)
    counts = torch.tensor(sizes, dtype=torch.float64)[group_ids]
    sums = torch.zeros(len(sizes), dtype=torch.float64).index_add_(0, group_ids, rloo)
    example = ADVANTAGES.get("rloo")(torch.tensor([0.9, 0.6, 0.2, 0.0], dtype=torch.float64), torch.zeros(4, dtype=torch.long))
    return Measured({"groups": len(sizes), "max_group_sum": float(sums.abs().max()),
                     "max_scale_error": float((rloo - counts / (counts - 1) * centered).abs().max()),
                     "example_first": float(example[0]), "example_mean_baseline": 0.9 - 0.425})


def _judge_rloo(v: dict, limits: dict) -> Verdict:
    if v["max_group_sum"] <= limits["tol"] and v["max_scale_error"] <= limits["tol"]:
        return Verdict(HOLDS, "identity")
    return Verdict(FAILS, "broken")


RLOO = Claim(
    name="rloo_leave_one_out", fast=True,
    papers=("Back to Basics (RLOO), Ahmadian et al. 2024, arXiv:2402.14740",),
    text="RLOO's leave-one-out advantages sum to zero in each group and equal K/(K−1) times the "
         "mean-baseline advantage.",
    criterion="lmpo's rloo and dr_grpo (mean baseline) on random rewards in groups of 2–16, float64. Holds if "
              "every group's sum and the largest |A_rloo − K/(K−1)·A_mean| are ≤ {tol:g}.",
    summary="max |group sum| {max_group_sum:.2g}; max scale error {max_scale_error:.2g}; "
            "0.9,0.6,0.2,0.0 → {example_first:.5f} = 4/3 × {example_mean_baseline:.3f}",
    notes={"identity": "R_i − mean_{{j≠i}} R_j = (K/(K−1))·(R_i − mean_j R_j): RLOO is the mean baseline "
                       "scaled up by K/(K−1), so both sum to zero.",
           "broken": "The identity failed: largest group sum {max_group_sum:.3g}, scale error {max_scale_error:.3g}."},
    limits={"tol": 1e-9},
    measure=_rloo_identity, judge=_judge_rloo,
)


# --- GRPO's std normalisation up-weights low-variance groups --------------------------------------

def _std_weights(ctx: Context) -> Measured:
    """Per group of 8 binary rewards with k right: the total |advantage| under grpo and dr_grpo."""
    ks = list(range(1, GROUP))
    grpo_w, dr_w = [], []
    for k in ks:
        rewards = torch.tensor([1.0] * k + [0.0] * (GROUP - k), dtype=torch.float64)
        ids = torch.zeros(GROUP, dtype=torch.long)
        grpo_w.append(float(ADVANTAGES.get("grpo")(rewards, ids).abs().sum()))
        dr_w.append(float(ADVANTAGES.get("dr_grpo")(rewards, ids).abs().sum()))
    multiplier = [g / d for g, d in zip(grpo_w, dr_w)]
    fig, (left, right) = plots.figure(2)
    plots.lines(left, {"grpo": (ks, grpo_w), "dr_grpo": (ks, dr_w)}, "total |A| of a group of 8",
                "right answers in the group (k)", "Σ|A_i|", marker="o")
    plots.lines(right, {"grpo / dr_grpo": (ks, multiplier)}, "weight multiplier = 1/std", "k", "×", marker="o")
    middle = GROUP // 2
    return Measured({"mult_k1": multiplier[0], "mult_mid": multiplier[middle - 1], "mult_k7": multiplier[-1],
                     "rare_right_grpo": float(ADVANTAGES.get("grpo")(torch.tensor([1.0] + [0.0] * (GROUP - 1),
                                                                       dtype=torch.float64),
                                                          torch.zeros(GROUP, dtype=torch.long))[0]),
                     "rare_right_dr": (GROUP - 1) / GROUP}, plots.png(fig))


def _judge_std(v: dict, limits: dict) -> Verdict:
    edge = min(v["mult_k1"], v["mult_k7"])
    if edge > v["mult_mid"] * (1 + limits["margin"]):
        return Verdict(HOLDS, "upweights")
    if edge < v["mult_mid"] * (1 - limits["margin"]):
        return Verdict(FAILS, "downweights")
    return Verdict(DEPENDS, "flat")


STD_WEIGHTS = Claim(
    name="grpo_std_upweights", fast=True,
    papers=("Understanding R1-Zero-Like Training (Dr. GRPO), Liu et al. 2025, arXiv:2503.20783",),
    text="GRPO's division by the group's standard deviation up-weights low-variance groups: questions that are "
         "almost always or almost never answered right.",
    criterion="Groups of 8 binary rewards with k = 1…7 right; the multiplier of grpo over dr_grpo (same "
              "advantages without the division) is Σ|A_grpo| / Σ|A_dr_grpo|. Holds if the multiplier at k = 1 and "
              "k = 7 exceeds the one at k = 4 by more than {margin:.0%}.",
    summary="multiplier k=1: {mult_k1:.2f}, k=4: {mult_mid:.2f}, k=7: {mult_k7:.2f}; "
            "the lone right answer's A: {rare_right_grpo:.2f} (grpo) vs {rare_right_dr:.3f} (dr_grpo)",
    notes={"upweights": "Dividing by the std multiplies a 1-of-8 group's advantages by {mult_k1:.2f} but a 4-of-8 "
                        "group's by {mult_mid:.2f}: the rare right answer gets A = {rare_right_grpo:.2f}.",
           "downweights": "The extreme groups were multiplied by less than the balanced one.",
           "flat": "The multiplier hardly depends on k."},
    limits={"margin": 0.10},
    measure=_std_weights, judge=_judge_std,
)

CLAIMS = [ZERO_SIGNAL, RLOO, STD_WEIGHTS]
