"""Claims about preference optimisation: what DPO needs, its gradient, IPO's target, online vs offline."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import torch

from lmpo.algos import PREFERENCE_LOSSES
from lmpo.teach.factcheck import plots
from lmpo.teach.factcheck.context import Context
from lmpo.teach.factcheck.core import DEPENDS, FAILS, HOLDS, Claim, Measured, Verdict
from lmpo.teach.factcheck.runs import EVAL_PROBLEMS


# --- 3. DPO needs neither a reward model nor sampling while it trains -------------------------------

@contextlib.contextmanager
def counted_calls():
    """Counts, while open, the built-in engine's generate calls (sampling vs greedy) and the reward
    runner's scoring calls, by wrapping the functions the trainers call."""
    from lmpo.rollout import engines
    from lmpo.rollout.reward_runner import RewardRunner

    counts = {"sampling_calls": 0, "sampled_sequences": 0, "greedy_calls": 0, "reward_calls": 0}
    generate, score = engines.generate, RewardRunner.score

    def counting_generate(model, prompts, params, **options):
        if params.temperature > 0:
            counts["sampling_calls"] += 1
            counts["sampled_sequences"] += len(prompts)
        else:
            counts["greedy_calls"] += 1
        return generate(model, prompts, params, **options)

    def counting_score(self, *args, **options):
        counts["reward_calls"] += 1
        return score(self, *args, **options)

    engines.generate, RewardRunner.score = counting_generate, counting_score
    try:
        yield counts
    finally:
        engines.generate, RewardRunner.score = generate, score


def _dpo_needs(ctx: Context) -> Measured:
    from lmpo.trainers.online_dpo import train_online_dpo
    from lmpo.trainers.preference import train_preference

    values = {}
    runs = {"dpo": (train_preference, ctx.stage("dpo", "needs_dpo", "dpo", pairs=256, eval_problems=100, save_every=0)),
            "online": (train_online_dpo, ctx.stage("online_dpo", "needs_online_dpo", "online_dpo", rounds=2,
                                                   prompts_per_round=16, eval_problems=0, save_every=0))}
    for tag, (train, cfg) in runs.items():
        with ctx.quiet(Path(cfg.out).name), counted_calls() as counts:
            train(cfg)
        result = json.loads((Path(cfg.out) / "result.json").read_text())
        held = result.get("models_held", {})
        values.update({f"{tag}_{k}": v for k, v in counts.items()})
        values[f"{tag}_models_held"] = sum(held.values())
        values[f"{tag}_held"] = ", ".join(f"{k} {v}" for k, v in held.items())
    values["dpo_steps"] = -(-256 // runs["dpo"][1].batch_size)
    return Measured(values)


def _judge_dpo_needs(v: dict, limits: dict) -> Verdict:
    if v["online_sampling_calls"] == 0 or v["online_reward_calls"] == 0:
        return Verdict(DEPENDS, "no_control")
    if v["dpo_sampling_calls"] == 0 and v["dpo_reward_calls"] == 0:
        return Verdict(HOLDS, "offline")
    return Verdict(FAILS, "sampled")


DPO_NEEDS = Claim(
    name="dpo_no_rm_no_sampling", fast=False,
    papers=("DPO, Rafailov et al. 2023, arXiv:2305.18290",),
    text="DPO needs neither a reward model nor sampling while it trains.",
    criterion="A real DPO run (the pipeline's settings, 256 pairs) with lmpo's generate and reward scoring counted; "
              "greedy evaluation calls are counted apart. Holds if DPO made no sampling call and no reward call, "
              "while the control — online DPO, 2 rounds — made both (else the counter proves nothing).",
    summary="DPO ({dpo_steps} steps): {dpo_sampling_calls} sampling, {dpo_reward_calls} reward calls, models held: "
            "{dpo_held}; online DPO: {online_sampling_calls} sampling calls ({online_sampled_sequences} "
            "sequences), {online_reward_calls} reward calls, models held: {online_held}",
    notes={"offline": "DPO trained on fixed pairs: no sequence sampled, no reward scored; it held only the policy "
                      "(the reference's log-probs are computed once, before training). Its {dpo_greedy_calls} "
                      "generate calls were greedy held-out evaluation. Online DPO, the control, sampled "
                      "{online_sampled_sequences} sequences and scored them.",
           "sampled": "DPO sampled ({dpo_sampling_calls} calls) or scored rewards ({dpo_reward_calls} calls).",
           "no_control": "The control did not sample or score either: the counters did not work."},
    limits={},
    measure=_dpo_needs, judge=_judge_dpo_needs,
)


# --- 13. online DPO beats offline DPO at the same pair budget ----------------------------------------

ONLINE_ROUNDS = 20


def _online_vs_offline(ctx: Context) -> Measured:
    from lmpo.reports.metrics import kept_rows, read_metrics
    from lmpo.trainers.online_dpo import train_online_dpo
    from lmpo.trainers.preference import train_preference

    def train(fn, cfg):
        with ctx.quiet(Path(cfg.out).name):
            return fn(cfg)

    online_cfg = ctx.stage("online_dpo", "online_dpo", "online_dpo", rounds=ONLINE_ROUNDS,
                           eval_every=ONLINE_ROUNDS, eval_problems=EVAL_PROBLEMS, save_every=0)
    online = ctx.once("online_dpo", lambda: train(train_online_dpo, online_cfg))
    rows = kept_rows(read_metrics(Path(online.run_dir) / "metrics.jsonl"))
    pairs = int(sum(r.get("pairs", 0) for r in rows if "round" in r))
    offline_cfg = ctx.stage("dpo", "offline_dpo", "dpo", pairs=pairs, eval_problems=EVAL_PROBLEMS, save_every=0)
    offline = train(train_preference, offline_cfg)
    n = EVAL_PROBLEMS
    a, b = online.accuracy, offline.accuracy
    se = math.sqrt(a * (1 - a) / n + b * (1 - b) / n)
    values = {"pairs": pairs, "rounds": ONLINE_ROUNDS, "prompts": ONLINE_ROUNDS * online_cfg.prompts_per_round,
              "acc_online": a, "acc_offline": b, "acc_start": ctx.start().sft_accuracy, "diff": a - b,
              "diff_se": (a - b) / se if se else 0.0, "n": n}
    fig, (ax,) = plots.figure(1, width=4.5)
    plots.bars(ax, {"SFT": values["acc_start"], f"offline DPO\n{pairs} pairs": b, f"online DPO\n{pairs} pairs": a},
               "held-out accuracy (greedy, 500 problems)", "accuracy")
    return Measured(values, plots.png(fig))


def _judge_online(v: dict, limits: dict) -> Verdict:
    if v["diff_se"] > limits["z"]:
        return Verdict(HOLDS, "online_better")
    if v["diff_se"] < -limits["z"]:
        return Verdict(FAILS, "offline_better")
    return Verdict(DEPENDS, "tie")


ONLINE = Claim(
    name="online_beats_offline_dpo", fast=False,
    papers=("Online AI Feedback (OAIF), Guo et al. 2024, arXiv:2402.04792",
            "Iterative RPO, Pang et al. 2024, arXiv:2404.19733"),
    text="Online DPO (pairs sampled from the current policy and ranked) beats offline DPO at the same pair budget.",
    criterion="Online DPO ({rounds:g} rounds of the pipeline's settings, pairs ranked by the verifier), then offline "
              "DPO on the task's fixed pairs with as many pairs as online DPO trained on; held-out greedy accuracy "
              "on 500 problems. Holds if online is better by more than {z:g} standard errors of the difference; "
              "does not hold if worse by more than that; else it depends.",
    summary="{pairs} pairs each: online {acc_online:.1%}, offline {acc_offline:.1%} (SFT {acc_start:.1%}); "
            "difference {diff:+.1%} = {diff_se:+.1f} SE",
    notes={"online_better": "On {pairs} pairs, online DPO reached {acc_online:.1%} against offline's "
                            "{acc_offline:.1%}: its pairs are the policy's own mistakes, ranked by the verifier.",
           "offline_better": "Offline DPO did better ({acc_offline:.1%} vs {acc_online:.1%}): the fixed pairs, near "
                             "misses written for this task, taught more per pair than the policy's own samples.",
           "tie": "{acc_online:.1%} online vs {acc_offline:.1%} offline, {diff_se:+.1f} standard errors: not "
                  "distinguishable at {pairs} pairs and one seed. Depends on the offline pairs' quality and how "
                  "far the policy drifts from them."},
    limits={"z": 2.0, "rounds": ONLINE_ROUNDS},
    measure=_online_vs_offline, judge=_judge_online,
)


# --- DPO's gradient weight is σ(−margin) -----------------------------------------------------------

def _dpo_weight(ctx: Context) -> Measured:
    beta = 0.1
    margins = torch.linspace(-8, 8, 161, dtype=torch.float64)
    chosen = (margins / beta).clone().requires_grad_()  # h = β (π_w − 0) − β (0 − 0) = margin
    zeros = torch.zeros_like(margins)
    loss, figures = PREFERENCE_LOSSES.get("dpo")(chosen, zeros, zeros, zeros, beta=beta)
    (grad,) = torch.autograd.grad(loss.sum(), chosen)
    weight = -grad / beta
    expected = torch.sigmoid(-figures["margin"])
    fig, (ax,) = plots.figure(1, width=5.0)
    plots.lines(ax, {"−(∂loss/∂log π_w)/β": (margins.tolist(), weight.tolist())}, "DPO's weight on a pair",
                "margin h", "weight")
    return Measured({"max_error": float((weight - expected).abs().max()), "beta": beta,
                     "weight_at_0": float(weight[80]), "weight_at_5": float(weight[130]),
                     "weight_at_m5": float(weight[30])}, plots.png(fig))


def _judge_tol(good: str, bad: str, key: str = "max_error"):
    def judge(v: dict, limits: dict) -> Verdict:
        return Verdict(HOLDS, good) if v[key] <= limits["tol"] else Verdict(FAILS, bad)
    return judge


DPO_WEIGHT = Claim(
    name="dpo_weight_sigmoid", fast=True,
    papers=("DPO, Rafailov et al. 2023, arXiv:2305.18290 (§4, 'What does the DPO update do?')",),
    text="DPO weighs each pair's gradient by σ(−h): how wrongly the implicit reward model orders it.",
    criterion="Autograd through lmpo's dpo loss for margins h from −8 to 8 (β = 0.1). Holds if −(∂loss/∂log π(y_w))/β "
              "equals σ(−h) within {tol:g} everywhere.",
    summary="max |weight − σ(−h)| = {max_error:.2g}; weight at h = −5: {weight_at_m5:.3f}, 0: {weight_at_0:.3f}, "
            "5: {weight_at_5:.4f}",
    notes={"sigmoid": "A pair ordered wrongly by 5 nats gets weight {weight_at_m5:.3f}, one ordered rightly by 5 "
                      "gets {weight_at_5:.4f}: DPO pushes the pairs it already gets right less and less; the weight fades but "
                      "never reaches 0.",
           "not_sigmoid": "The weight differs from σ(−h) by up to {max_error:.3g}."},
    limits={"tol": 1e-12},
    measure=_dpo_weight, judge=_judge_tol("sigmoid", "not_sigmoid"),
)


# --- IPO's loss is minimal at margin 1/(2τ) -------------------------------------------------------

TAUS = (0.1, 0.5, 1.0)


def _ipo_minimum(ctx: Context) -> Measured:
    values, worst_grad, worst_argmin = {}, 0.0, 0.0
    for name, tau in zip(("small", "mid", "large"), TAUS):
        target = 1 / (2 * tau)
        d = torch.linspace(target - 2, target + 2, 4001, dtype=torch.float64)
        zeros, ones = torch.zeros_like(d), torch.ones_like(d)
        loss, _ = PREFERENCE_LOSSES.get("ipo")(d, zeros, zeros, zeros, beta=tau, chosen_lengths=ones,
                                                rejected_lengths=ones)
        worst_argmin = max(worst_argmin, abs(float(d[loss.argmin()]) - target))
        at = torch.tensor([target], dtype=torch.float64, requires_grad=True)
        z1 = torch.zeros(1, dtype=torch.float64)
        value, _ = PREFERENCE_LOSSES.get("ipo")(at, z1, z1, z1, beta=tau, chosen_lengths=z1 + 1, rejected_lengths=z1 + 1)
        (grad,) = torch.autograd.grad(value.sum(), at)
        worst_grad = max(worst_grad, abs(float(grad)))
        values[f"target_{name}"] = target
    z = torch.zeros(2, dtype=torch.float64)
    dpo_loss, _ = PREFERENCE_LOSSES.get("dpo")(torch.tensor([50.0, 100.0], dtype=torch.float64), z, z, z, beta=0.1)
    values.update({"max_grad_at_target": worst_grad, "max_argmin_error": worst_argmin, "grid_step": 1e-3,
                   "dpo_loss_h5": float(dpo_loss[0]), "dpo_loss_h10": float(dpo_loss[1])})
    return Measured(values)


def _judge_ipo(v: dict, limits: dict) -> Verdict:
    if v["max_grad_at_target"] <= limits["tol"] and v["max_argmin_error"] <= limits["grid"]:
        return Verdict(HOLDS, "finite_target")
    return Verdict(FAILS, "elsewhere")


IPO = Claim(
    name="ipo_target_margin", fast=True,
    papers=("IPO, Azar et al. 2023, arXiv:2310.12036",),
    text="IPO's loss has its minimum at the finite margin 1/(2τ), where DPO's keeps falling as the margin grows.",
    criterion="lmpo's ipo loss (token-averaged log-ratios, τ = β) for τ = 0.1, 0.5, 1 on a grid of margins ±2 "
              "around 1/(2τ), step 0.001, and its autograd gradient at 1/(2τ). Holds if the gradient there is "
              "≤ {tol:g} and the grid minimum is within {grid:g} of 1/(2τ).",
    summary="|∂loss/∂d| at 1/(2τ): {max_grad_at_target:.2g}; grid argmin off by ≤ {max_argmin_error:.2g}; targets "
            "{target_small:g}, {target_mid:g}, {target_large:g}; DPO loss at h = 5: {dpo_loss_h5:.4f}, "
            "h = 10: {dpo_loss_h10:.6f}",
    notes={"finite_target": "IPO pulls the margin to 1/(2τ) ({target_small:g} at τ = 0.1) and pushes back beyond it; "
                            "DPO's loss still falls from {dpo_loss_h5:.4f} to {dpo_loss_h10:.6f} between h = 5 and 10, "
                            "so on separable pairs it drives the margin on without limit.",
           "elsewhere": "IPO's minimum is not at 1/(2τ) (gradient {max_grad_at_target:.3g}, argmin off by "
                        "{max_argmin_error:.3g})."},
    limits={"tol": 1e-9, "grid": 1e-3},
    measure=_ipo_minimum, judge=_judge_ipo,
)

CLAIMS = [DPO_NEEDS, ONLINE, DPO_WEIGHT, IPO]
