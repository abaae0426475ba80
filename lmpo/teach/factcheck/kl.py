"""Claims about the KL to the reference: its estimators, what β does, and the frozen reference."""

from __future__ import annotations

import math

import torch

from lmpo.algos import KL_ESTIMATORS
from lmpo.teach.factcheck import plots
from lmpo.teach.factcheck.context import Context
from lmpo.teach.factcheck.core import DEPENDS, FAILS, HOLDS, Claim, Measured, Verdict
from lmpo.teach.factcheck.runs import RL_STEPS, rl_run

SAMPLES = 200_000
SCALES = (0.25, 0.5, 1.0, 2.0)  # logit scales of the distribution pairs: from close to far apart
VOCAB = 50


# --- 4. k1, k2, k3 ---------------------------------------------------------------------------

def _estimators(ctx: Context) -> Measured:
    """Monte Carlo of lmpo's k1, k2, k3 on samples from p, against the exact KL(p || q)."""
    gen = torch.Generator().manual_seed(ctx.seed)
    rows = []
    for scale in SCALES:
        log_p = (scale * torch.randn(VOCAB, generator=gen, dtype=torch.float64)).log_softmax(0)
        log_q = (scale * torch.randn(VOCAB, generator=gen, dtype=torch.float64)).log_softmax(0)
        exact = float((log_p.exp() * (log_p - log_q)).sum())
        x = torch.multinomial(log_p.exp(), SAMPLES, replacement=True, generator=gen)
        row = {"exact": exact}
        for name in ("k1", "k2", "k3"):
            per_sample = KL_ESTIMATORS.get(name)(log_p[x], log_q[x])
            row[name] = float(per_sample.mean())
            row[f"{name}_z"] = (row[name] - exact) / (float(per_sample.std()) / math.sqrt(SAMPLES))
            row[f"{name}_min"] = float(per_sample.min())
            row[f"{name}_neg"] = float((per_sample < 0).double().mean())
        rows.append(row)
    values = {"pairs": len(rows), "samples": SAMPLES,
              "k1_max_z": max(abs(r["k1_z"]) for r in rows), "k3_max_z": max(abs(r["k3_z"]) for r in rows),
              "k2_max_z": max(abs(r["k2_z"]) for r in rows), "k3_min": min(r["k3_min"] for r in rows),
              "k1_min": min(r["k1_min"] for r in rows), "k1_neg_share": max(r["k1_neg"] for r in rows),
              "far_exact": rows[-1]["exact"], "far_k2": rows[-1]["k2"], "far_k3": rows[-1]["k3"],
              "far_k1": rows[-1]["k1"], "close_exact": rows[0]["exact"], "close_k2": rows[0]["k2"]}
    fig, (ax,) = plots.figure(1, width=6.0)
    width = 0.2
    for i, name in enumerate(("exact", "k1", "k2", "k3")):
        ax.bar([j + (i - 1.5) * width for j in range(len(rows))], [r[name] for r in rows], width, label=name)
    ax.set_xticks(range(len(rows)), [f"KL={r['exact']:.2f}" for r in rows], fontsize=8)
    ax.set_title(f"mean of each estimator over {SAMPLES:,} samples from p vs exact KL(p||q)", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return Measured(values, plots.png(fig))


def _judge_estimators(v: dict, limits: dict) -> Verdict:
    k3_ok = v["k3_max_z"] <= limits["z"] and v["k3_min"] >= 0
    if not k3_ok:
        return Verdict(FAILS, "k3_off")
    if v["k1_max_z"] > limits["z"]:
        return Verdict(FAILS, "k1_off")
    if v["k1_min"] >= 0:
        return Verdict(FAILS, "k1_never_negative")
    return Verdict(HOLDS, "k2_biased" if v["k2_max_z"] > limits["z"] else "k2_not_biased")


ESTIMATORS = Claim(
    name="kl_estimators", fast=True,
    papers=("Schulman 2020, Approximating KL Divergence, http://joschu.net/blog/kl-approx.html",
            "DeepSeekMath (GRPO's k3 term), Shao et al. 2024, arXiv:2402.03300"),
    text="k3 = exp(κ) − 1 − κ is an unbiased and never negative estimate of KL(π‖π_ref); k1 = log π − log π_ref "
         "is unbiased too but can be negative per sample; k2 = κ²/2 is biased.",
    criterion="Four pairs of categorical distributions over 50 tokens, {samples:,.0f} samples from p each, "
              "lmpo's k1/k2/k3 against the exact KL. Holds if k3's mean is within {z:g} standard errors of the "
              "exact KL for every pair, k3 is never below 0, k1's mean is within {z:g} standard errors too, and some k1 "
              "sample is below 0.",
    summary="k3: worst |z| {k3_max_z:.1f}, min {k3_min:.3g}; k1: worst |z| {k1_max_z:.1f}, min {k1_min:.2f}, "
            "up to {k1_neg_share:.0%} negative; k2: worst |z| {k2_max_z:.0f} (far pair: {far_k2:.3f} vs "
            "KL {far_exact:.3f})",
    notes={"k2_biased": "k1 and k3 both average to the exact KL; k1 is negative on up to {k1_neg_share:.0%} of "
                        "samples, k3 never. k2 is biased: {far_k2:.3f} against {far_exact:.3f} on the farthest pair, "
                        "{close_k2:.4f} against {close_exact:.4f} on the closest (small when π ≈ π_ref).",
           "k2_not_biased": "k1 and k3 both average to the exact KL; k1 is negative on up to {k1_neg_share:.0%} "
                            "of samples, k3 never; k2's bias was not measurable at this sample size.",
           "k3_off": "k3 missed the exact KL (worst |z| {k3_max_z:.1f}) or went below 0 ({k3_min:.3g}).",
           "k1_off": "k1 missed the exact KL: worst |z| {k1_max_z:.1f}, so it is not unbiased here.",
           "k1_never_negative": "No k1 sample was negative."},
    limits={"z": 4.0, "samples": SAMPLES},
    measure=_estimators, judge=_judge_estimators,
)


# --- the k3 term in the loss: which KL does its gradient minimise? -----------------------------------

def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def _loss_gradients(ctx: Context) -> Measured:
    """Per distribution pair: the expected gradient (exact, over the vocabulary, tokens drawn from π)
    of each estimator used as a loss term — differentiated through log π of the sampled token, as
    the RL loss does — against the gradients of the exact reverse and forward KL."""
    gen = torch.Generator().manual_seed(ctx.seed)
    worst: dict[str, float] = {}
    for scale in SCALES:
        logits = (scale * torch.randn(VOCAB, generator=gen, dtype=torch.float64)).requires_grad_()
        log_q = (scale * torch.randn(VOCAB, generator=gen, dtype=torch.float64)).log_softmax(0)

        def grad(objective) -> torch.Tensor:
            (g,) = torch.autograd.grad(objective(logits.log_softmax(0)), logits)
            return g

        p = logits.detach().softmax(0)
        reverse = grad(lambda lp: (lp.exp() * (lp - log_q)).sum())
        forward = grad(lambda lp: (log_q.exp() * (log_q - lp)).sum())
        as_loss = {name: grad(lambda lp, f=KL_ESTIMATORS.get(name): (p * f(lp, log_q)).sum())
                   for name in ("k1", "k2", "k3")}
        as_loss["k3_ratio"] = grad(lambda lp: (p * KL_ESTIMATORS.get("k3_ratio")(lp, log_q, old_logprobs=lp.detach())).sum())
        figures = {"k3_vs_reverse": _relative(as_loss["k3"], reverse), "k3_vs_forward": _relative(as_loss["k3"], forward),
                   "k2_vs_reverse": _relative(as_loss["k2"], reverse),
                   "k3_ratio_vs_reverse": _relative(as_loss["k3_ratio"], reverse),
                   "k1_norm": float(as_loss["k1"].norm())}
        if scale == SCALES[0]:
            worst["close_k3_vs_reverse"] = figures["k3_vs_reverse"]
            worst["close_kl"] = float((p * (p.log() - log_q)).sum())
        for key, value in figures.items():
            worst[key] = max(worst.get(key, 0.0), value)
    return Measured(worst)


def _judge_loss_gradients(v: dict, limits: dict) -> Verdict:
    if v["k3_vs_reverse"] <= limits["tol"]:
        return Verdict(HOLDS, "reverse")
    if v["k3_vs_forward"] <= limits["tol"]:
        return Verdict(FAILS, "forward")
    return Verdict(FAILS, "neither")


K3_LOSS = Claim(
    name="k3_loss_minimises_kl", fast=True,
    papers=("DeepSeekMath (GRPO's k3 loss term), Shao et al. 2024, arXiv:2402.03300",
            "On a few pitfalls in KL divergence gradient estimation for RL, Tang & Munos 2025, arXiv:2506.09477"),
    text="Adding β·k3 to the loss, as GRPO does, minimises KL(π‖π_ref): k3 is an unbiased estimate of it, so its "
         "gradient is the KL's gradient.",
    criterion="Four pairs of categorical distributions over 50 tokens: the exact expected gradient, over tokens drawn "
              "from π, of lmpo's k1/k2/k3/k3_ratio used as a loss (differentiated through log π of the token, as in "
              "the RL loss), against autograd of the exact KL(π‖π_ref) and KL(π_ref‖π). Holds if k3's gradient is "
              "the reverse KL's within a relative {tol:g} for every pair.",
    summary="relative gap to ∇KL(π‖π_ref): k3 up to {k3_vs_reverse:.2f} (closest pair {close_k3_vs_reverse:.3f}), "
            "k2 {k2_vs_reverse:.1g}, k3_ratio {k3_ratio_vs_reverse:.1g}; k3 to ∇KL(π_ref‖π): {k3_vs_forward:.1g}; "
            "k1's expected gradient {k1_norm:.1g}",
    notes={"forward": "k3 estimates KL(π‖π_ref) without bias, but its gradient as a loss is that of the forward "
                      "KL(π_ref‖π) (gap {k3_vs_forward:.1g}), up to {k3_vs_reverse:.0%} away from the reverse KL's; "
                      "the gap shrinks as π nears π_ref ({close_k3_vs_reverse:.0%} on the closest pair, KL "
                      "{close_kl:.3f}). On-policy, k2 and k3_ratio give the reverse KL's gradient; k1's is zero in "
                      "expectation.",
           "reverse": "k3's loss gradient matched the reverse KL's (gap {k3_vs_reverse:.2g}).",
           "neither": "k3's loss gradient matched neither KL (gaps {k3_vs_reverse:.3g}, {k3_vs_forward:.3g})."},
    limits={"tol": 1e-6},
    measure=_loss_gradients, judge=_judge_loss_gradients,
)


# --- 9. a larger β keeps the policy closer to the reference ----------------------------------------

BETAS = (0.0, 0.3)


@torch.no_grad()
def sequence_kls(policy, reference, tokenizer, problems, max_new_tokens: int, seed: int) -> list[float]:
    """Per sampled completion (T = 1, from `policy`): the exact per-token KL(policy ‖ reference)
    over the whole vocabulary, averaged over the completion's tokens."""
    from lmpo.envs.data.chat import encode_start
    from lmpo.models.logprobs import completion_inputs
    from lmpo.rollout import SamplingParams, left_pad
    from lmpo.rollout.engine import generate

    prompts = [encode_start(tokenizer, p.prompt) for p in problems]
    rollout = generate(policy, prompts, SamplingParams(1.0, max_new_tokens=max_new_tokens),
                       eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                       generator=torch.Generator().manual_seed(seed))
    prompt_ids, prompt_mask = left_pad(rollout.prompt_ids, tokenizer.pad_token_id)
    inputs = completion_inputs(prompt_ids, prompt_mask, rollout.completion_ids)
    keep = rollout.completion_ids.size(1) + 1
    log_p = policy(**inputs, logits_to_keep=keep, use_cache=False).logits[:, :-1].float().log_softmax(-1)
    log_q = reference(**inputs, logits_to_keep=keep, use_cache=False).logits[:, :-1].float().log_softmax(-1)
    per_token = (log_p.exp() * (log_p - log_q)).sum(-1)
    mask = rollout.loss_mask
    return ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).tolist()


def _beta_runs(ctx: Context) -> Measured:
    from lmpo.envs import make_task
    from lmpo.models import load_model, load_tokenizer

    start = ctx.start().model_dir
    tokenizer = load_tokenizer(start)
    reference = load_model(start, tokenizer, keep_dropout=False).eval()
    problems = make_task(ctx.task).heldout_problems(500)
    values, curves = {}, {}
    for tag, beta in zip(("low", "high"), BETAS):
        run = rl_run(ctx, f"grpo_beta{beta:g}", beta=beta)
        policy = load_model(str(run.out / "model"), tokenizer, keep_dropout=False).eval()
        kls = sequence_kls(policy, reference, tokenizer, problems, run.result["config"]["max_new_tokens"], ctx.seed)
        mean = sum(kls) / len(kls)
        var = sum((k - mean) ** 2 for k in kls) / (len(kls) - 1)
        values.update({f"beta_{tag}": beta, f"kl_{tag}": mean, f"se_{tag}": math.sqrt(var / len(kls)),
                       f"acc_{tag}": run.evals()[-1], f"reward_{tag}": sum(run.series("reward_mean")[-10:]) / 10})
        curves[f"β={beta:g}"] = plots.rolling(run.series("reward_mean"))
    values["acc_start"] = ctx.start().sft_accuracy
    values["kl_diff_se"] = (values["kl_low"] - values["kl_high"]) / math.hypot(values["se_low"], values["se_high"])
    fig, (left, right) = plots.figure(2)
    plots.bars(left, {f"β={b:g}": values[f"kl_{t}"] for t, b in zip(("low", "high"), BETAS)},
               "exact KL(π‖π_ref) after training", "nats / token")
    plots.lines(right, {k: (range(1, len(v) + 1), v) for k, v in curves.items()}, "training reward (what β trades off)",
                "step", "5-step mean")
    return Measured(values, plots.png(fig))


def _judge_beta(v: dict, limits: dict) -> Verdict:
    if v["kl_diff_se"] > limits["z"] and v["kl_high"] < v["kl_low"] * (1 - limits["margin"]):
        return Verdict(HOLDS, "closer")
    if v["kl_diff_se"] < -limits["z"]:
        return Verdict(FAILS, "farther")
    return Verdict(DEPENDS, "no_difference")


BETA_CLOSER = Claim(
    name="beta_keeps_close", fast=False,
    papers=("InstructGPT, Ouyang et al. 2022, arXiv:2203.02155", "DeepSeekMath, Shao et al. 2024, arXiv:2402.03300"),
    text="A larger β keeps the policy closer to the reference model.",
    criterion="Two GRPO runs (the pipeline's preset, {steps:g} steps) from the SFT start that differ only in β; then the "
              "exact per-token KL(π‖π_ref) over the vocabulary on one sample for each of 500 held-out prompts. "
              "Holds if the larger β's KL is lower by more than {z:g} standard errors and by more than "
              "{margin:.0%}; does not hold if it is higher by more than {z:g} standard errors.",
    summary="KL β={beta_low:g}: {kl_low:.3f}±{se_low:.3f}, β={beta_high:g}: {kl_high:.3f}±{se_high:.3f} "
            "nats/token; held-out {acc_low:.1%} vs {acc_high:.1%} (SFT {acc_start:.1%})",
    notes={"closer": "β = {beta_high:g} ended {kl_high:.3f} nats/token from the reference, β = {beta_low:g} "
                     "{kl_low:.3f} ({kl_diff_se:.1f} standard errors apart); held-out accuracy {acc_high:.1%} vs "
                     "{acc_low:.1%}.",
           "farther": "The larger β ended farther from the reference ({kl_high:.3f} vs {kl_low:.3f}).",
           "no_difference": "The two runs ended at about the same distance ({kl_high:.3f} vs {kl_low:.3f}, "
                            "{kl_diff_se:.1f} standard errors): at this budget β did not matter measurably."},
    limits={"z": 2.0, "margin": 0.2, "steps": RL_STEPS},
    measure=_beta_runs, judge=_judge_beta,
)


# --- 7. the reference model receives no gradient ---------------------------------------------------

def _reference_run(ctx: Context) -> Measured:
    run = rl_run(ctx, f"grpo_beta{BETAS[1]:g}", beta=BETAS[1])
    if not run.reference:
        raise RuntimeError("the run held no reference model (is β > 0?)")
    return Measured({**run.reference, "beta": BETAS[1], "steps": len(run.series("reward_mean")),
                     "models_reference": run.result.get("models_held", {}).get("reference", 0)})


def _judge_reference(v: dict, limits: dict) -> Verdict:
    if v["policy_max_change"] <= limits["tol"]:
        return Verdict(DEPENDS, "policy_still")
    frozen = v["reference_requires_grad"] == 0 and v["reference_grads"] == 0
    if frozen and v["reference_max_change"] <= limits["tol"]:
        return Verdict(HOLDS, "frozen")
    return Verdict(FAILS, "moved")


REFERENCE_FROZEN = Claim(
    name="reference_no_gradient", fast=False,
    papers=("InstructGPT, Ouyang et al. 2022, arXiv:2203.02155", "DeepSeekMath, Shao et al. 2024, arXiv:2402.03300"),
    text="The reference model receives no gradient: it stays exactly the starting model.",
    criterion="The reference model that lmpo's RL trainer builds (captured from `Run.reference`) in the β > 0 run "
              "above. Holds if none of its parameters requires a gradient, none has a .grad after training, and "
              "its weights differ from the SFT checkpoint's by at most {tol:g}, while the policy's do move.",
    summary="{reference_params} reference tensors: {reference_requires_grad} require grad, {reference_grads} have "
            ".grad, max change {reference_max_change:.3g}; policy max change {policy_max_change:.3g} "
            "after {steps} steps",
    notes={"frozen": "After {steps} steps at β = {beta:g} the policy's weights moved by up to "
                     "{policy_max_change:.3g}; the reference's by {reference_max_change:g}, and it never held a "
                     "gradient.",
           "moved": "The reference could learn or changed: {reference_requires_grad} tensors require grad, "
                    "{reference_grads} hold one, max change {reference_max_change:.3g}.",
           "policy_still": "The policy did not move either, so the run says nothing."},
    limits={"tol": 0.0},
    measure=_reference_run, judge=_judge_reference,
)

CLAIMS = [ESTIMATORS, K3_LOSS, BETA_CLOSER, REFERENCE_FROZEN]
