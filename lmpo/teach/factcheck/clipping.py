"""Claims about the importance ratio and its clipping: PPO, GSPO, clip-higher."""

from __future__ import annotations

import torch

from lmpo.algos import AGGREGATIONS, POLICY_LOSSES
from lmpo.teach.factcheck import plots
from lmpo.teach.factcheck.context import Context
from lmpo.teach.factcheck.core import DEPENDS, FAILS, HOLDS, Claim, Measured, Verdict
from lmpo.teach.factcheck.kl import BETAS
from lmpo.teach.factcheck.runs import RL_STEPS, head_mean, mean_of, rl_run, tail_mean

OFF_POLICY = {"num_minibatches": 4, "beta": 0.0}
"""Four optimizer steps per rollout batch: from the second on, the ratio moves and clipping can act."""


def _random_batch(gen: torch.Generator, rows: int = 16, width: int = 12, spread: float = 0.3):
    """(log-probs with grad, old log-probs, advantages, mask) of a random batch, float64."""
    old = -torch.rand(rows, width, generator=gen, dtype=torch.float64) * 3
    logprobs = (old + spread * torch.randn(rows, width, generator=gen, dtype=torch.float64)).requires_grad_()
    lengths = torch.randint(1, width + 1, (rows,), generator=gen)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).double()
    advantages = torch.randn(rows, 1, generator=gen, dtype=torch.float64).expand(rows, width)
    return logprobs, old, advantages, mask


# --- 5. with one update per batch the ratio is 1 and clipping never fires -------------------------

def _on_policy(ctx: Context) -> Measured:
    gen = torch.Generator().manual_seed(ctx.seed)
    logprobs, _, advantages, mask = _random_batch(gen)
    loss, info = POLICY_LOSSES.get("ppo_clip")(logprobs, logprobs.detach(), advantages, mask)
    aggregate = AGGREGATIONS.get("seq_mean_token_mean")
    (clip_grad,) = torch.autograd.grad(aggregate(loss, mask), logprobs)
    (pg_grad,) = torch.autograd.grad(aggregate(-advantages * logprobs, mask), logprobs)
    values = {"exact_clipped": float(info["clipped"].sum()), "exact_grad_gap": float((clip_grad - pg_grad).abs().max()),
              "sampler_ratio_gap": _sampler_ratio_gap(ctx)}
    on = rl_run(ctx, f"grpo_beta{BETAS[0]:g}", beta=BETAS[0])
    off = rl_run(ctx, f"clip_eps{EPS_HIGH[0]:g}", clip_eps_high=EPS_HIGH[0], **OFF_POLICY)
    values.update({"run_clip_max": max(on.series("clip_frac")), "run_steps": len(on.series("clip_frac")),
                   "control_clip_mean": mean_of(off.series("clip_frac")),
                   "control_updates": OFF_POLICY["num_minibatches"]})
    return Measured(values)


@torch.no_grad()
def _sampler_ratio_gap(ctx: Context) -> float:
    """max |π_θ/π_old − 1| on 64 completions sampled from the SFT model by the engine the RL trainer
    uses, with π_θ from the trainer's own forward (`completion_outputs`)."""
    from lmpo.envs import make_task
    from lmpo.envs.data.chat import encode_start
    from lmpo.models import completion_outputs, load_model, load_tokenizer
    from lmpo.rollout import SamplingParams, left_pad
    from lmpo.rollout.engine import generate

    start = ctx.start().model_dir
    tokenizer = load_tokenizer(start)
    model = load_model(start, tokenizer, keep_dropout=False)
    prompts = [encode_start(tokenizer, p.prompt)
               for p in make_task(ctx.task).train_problems(8, ctx.seed) for _ in range(8)]
    rollout = generate(model, prompts, SamplingParams(1.0, max_new_tokens=12), eos_id=tokenizer.eos_token_id,
                       pad_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(ctx.seed))
    prompt_ids, prompt_mask = left_pad(rollout.prompt_ids, tokenizer.pad_token_id)
    trainer = completion_outputs(model, prompt_ids, prompt_mask, rollout.completion_ids).logprobs
    gap = ((trainer - rollout.logprobs).exp() - 1).abs() * rollout.loss_mask
    return float(gap.max())


def _judge_on_policy(v: dict, limits: dict) -> Verdict:
    exact = v["exact_clipped"] == 0 and v["exact_grad_gap"] <= limits["tol"]
    if not exact or v["sampler_ratio_gap"] > limits["ratio_tol"] or v["run_clip_max"] > 0:
        return Verdict(FAILS, "clipped")
    if v["control_clip_mean"] <= 0:
        return Verdict(DEPENDS, "never_clips")
    return Verdict(HOLDS, "on_policy")


RATIO_ONE = Claim(
    name="one_update_no_clipping", fast=False,
    papers=("PPO, Schulman et al. 2017, arXiv:1707.06347", "DeepSeekMath (GRPO), Shao et al. 2024, arXiv:2402.03300"),
    text="With one optimizer step per rollout batch the importance ratio is 1, clipping never fires, and the "
         "update is the plain policy gradient.",
    criterion="(1) Exact: lmpo's ppo_clip with π_θ = π_old on a random batch: holds if nothing is clipped and the "
              "gradient equals −A·∇log π's within {tol:g}. (2) The SFT model's samples: |π_trainer/π_sampler − 1| "
              "≤ {ratio_tol:g}. (3) A real GRPO run (one update per batch): clip fraction 0 at every step; a "
              "control run with 4 updates per batch must clip (else the check cannot fail).",
    summary="exact: {exact_clipped:g} clipped, gradient gap {exact_grad_gap:.2g}; sampled max |r−1| "
            "{sampler_ratio_gap:.2g}; GRPO run max clip fraction {run_clip_max:g} over {run_steps} steps; "
            "control ({control_updates} updates/batch) {control_clip_mean:.3f}",
    notes={"on_policy": "On-policy the ratio is 1 up to float rounding ({sampler_ratio_gap:.2g}), so the clip "
                        "range is never reached: clip fraction {run_clip_max:g}. Clipping only acts from the second "
                        "update on a batch (control: {control_clip_mean:.1%} of tokens clipped) — and so does "
                        "clip-higher.",
           "clipped": "Something was clipped on-policy (exact {exact_clipped:g}, run max {run_clip_max:g}) or the "
                      "ratio drifted from 1 by {sampler_ratio_gap:.2g}.",
           "never_clips": "Nothing clipped on-policy, but the off-policy control never clipped either."},
    limits={"tol": 1e-12, "ratio_tol": 1e-4},
    measure=_on_policy, judge=_judge_on_policy,
)


# --- 8. GSPO's ratio is the geometric mean of the token ratios -------------------------------------

def _gspo_ratio(ctx: Context) -> Measured:
    gen = torch.Generator().manual_seed(ctx.seed)
    logprobs, old, _, mask = _random_batch(gen)
    ones = torch.ones(mask.size(0), 1, dtype=torch.float64)
    token_ratio = (logprobs.detach() - old).exp()
    lengths = mask.sum(1)
    geometric = torch.stack([token_ratio[i, : int(n)].prod() ** (1 / n) for i, n in enumerate(lengths)])
    arithmetic = (token_ratio * mask).sum(1) / lengths
    values = {"rows": mask.size(0)}
    for name in ("gspo", "gspo_token"):
        loss, _ = POLICY_LOSSES.get(name)(logprobs, old, ones, mask, clip_eps_low=1.0, clip_eps_high=1e9)
        ratio = -loss[:, 0].detach()  # with A = 1 and no clipping, the loss is −s_i on every token of row i
        values[f"{name}_rel_error"] = float(((ratio - geometric) / geometric).abs().max())
    values["am_gm_gap"] = float((arithmetic - geometric).max())
    values["am_gm_min"] = float((arithmetic - geometric).min())
    return Measured(values)


def _judge_gspo(v: dict, limits: dict) -> Verdict:
    if max(v["gspo_rel_error"], v["gspo_token_rel_error"]) <= limits["tol"]:
        return Verdict(HOLDS, "geometric")
    return Verdict(FAILS, "not_geometric")


GSPO = Claim(
    name="gspo_geometric_mean", fast=True,
    papers=("GSPO, Zheng et al. 2025, arXiv:2507.18071",),
    text="GSPO's sequence ratio is the geometric mean of the token ratios, (Π_t r_t)^(1/L).",
    criterion="lmpo's gspo and gspo_token losses with A = 1 and no clipping on 16 random rows (lengths 1–12, "
              "float64) against (Π_t r_t)^(1/L) computed directly. Holds if the largest relative error is "
              "≤ {tol:g}.",
    summary="max relative error gspo {gspo_rel_error:.2g}, gspo_token {gspo_token_rel_error:.2g}; arithmetic − "
            "geometric mean of the ratios: {am_gm_min:.2g} … {am_gm_gap:.2g}",
    notes={"geometric": "s_i = exp(mean_t ρ_t) is the geometric mean; it sits below the arithmetic mean of the "
                        "token ratios by up to {am_gm_gap:.3f} here, and one extreme token moves it less.",
           "not_geometric": "The sequence ratio differs from the geometric mean by up to {gspo_rel_error:.3g}."},
    limits={"tol": 1e-9},
    measure=_gspo_ratio, judge=_judge_gspo,
)


# --- PPO's clipped objective is a pessimistic bound ------------------------------------------------

def _pessimism(ctx: Context) -> Measured:
    eps = 0.2
    ratios = torch.linspace(0.3, 1.7, 281, dtype=torch.float64)
    values, curves = {"eps": eps}, {}
    gaps_in, gaps_all, binding = [], [], 0
    for a in (-2.0, -1.0, -0.5, 0.5, 1.0, 2.0):
        logprobs = ratios.log()[None, :]
        adv = torch.full_like(logprobs, a)
        loss, info = POLICY_LOSSES.get("ppo_clip")(logprobs, torch.zeros_like(logprobs), adv,
                                                   torch.ones_like(logprobs), clip_eps_low=eps, clip_eps_high=eps)
        clipped_objective, plain = -loss[0], ratios * a
        gaps_all.append(float((clipped_objective - plain).max()))
        inside = (ratios >= 1 - eps) & (ratios <= 1 + eps)
        gaps_in.append(float((clipped_objective - plain)[inside].abs().max()))
        binding += int(info["clipped"].sum())
        if a in (-1.0, 1.0):
            curves[f"clipped, A={a:+g}"] = (ratios.tolist(), clipped_objective.tolist())
            curves[f"r·A, A={a:+g}"] = (ratios.tolist(), plain.tolist())
    values.update({"max_excess": max(gaps_all), "max_gap_inside": max(gaps_in), "binding_points": binding,
                   "points": 6 * len(ratios)})
    fig, (ax,) = plots.figure(1, width=5.5)
    plots.lines(ax, curves, f"PPO objective vs ratio (ε = {eps})", "ratio r", "objective")
    return Measured(values, plots.png(fig))


def _judge_pessimism(v: dict, limits: dict) -> Verdict:
    if v["max_excess"] <= limits["tol"] and v["max_gap_inside"] <= limits["tol"] and v["binding_points"] > 0:
        return Verdict(HOLDS, "lower_bound")
    return Verdict(FAILS, "above")


PESSIMISM = Claim(
    name="ppo_clip_lower_bound", fast=True,
    papers=("PPO, Schulman et al. 2017, arXiv:1707.06347",),
    text="PPO's clipped objective min(r·A, clip(r)·A) is a pessimistic lower bound of the unclipped r·A.",
    criterion="lmpo's ppo_clip (ε = 0.2) on ratios 0.3–1.7 and advantages ±0.5, ±1, ±2. Holds if the clipped "
              "objective never exceeds r·A by more than {tol:g}, equals it inside [1−ε, 1+ε], and is strictly "
              "below it somewhere (where clipping binds).",
    summary="max(clipped − r·A) = {max_excess:.2g}; max gap inside the range {max_gap_inside:.2g}; clipping binds "
            "at {binding_points} of {points} points",
    notes={"lower_bound": "The clipped objective never rises above r·A; it flattens only where the change would "
                          "help (A > 0, r > 1+ε; A < 0, r < 1−ε), so a bad step is never hidden.",
           "above": "The clipped objective exceeded r·A by {max_excess:.3g}."},
    limits={"tol": 1e-12},
    measure=_pessimism, judge=_judge_pessimism,
)


# --- 11. clip-higher slows entropy collapse --------------------------------------------------------

EPS_HIGH = (0.2, 0.28)


def clip_higher_seeds(ctx: Context) -> tuple[int, int]:
    """The factcheck's seed and the next: --seed gives another sample of the claim, and the first
    run is claim 5's control (same options, same seed), trained once."""
    return ctx.seed, ctx.seed + 1


def _clip_higher(ctx: Context) -> Measured:
    from lmpo.trainers.presets import rl_preset

    seeds = clip_higher_seeds(ctx)
    values: dict = {"seeds": len(seeds), "steps": RL_STEPS,
                    "dapo_updates_per_batch": rl_preset("dapo").settings.get("num_minibatches", 1)}
    curves, ratios = {}, []
    for i, seed in enumerate(seeds, 1):  # value keys by position (_1, _2): the seeds follow --seed
        runs = {eps: rl_run(ctx, f"clip_eps{eps:g}", clip_eps_high=eps, seed=seed, **OFF_POLICY)
                for eps in EPS_HIGH}
        base, higher = (tail_mean(runs[eps].series("entropy")) for eps in EPS_HIGH)
        ratios.append(higher / base)
        values[f"seed_{i}"] = seed
        values[f"entropy_base_{i}"], values[f"entropy_high_{i}"] = base, higher
        values[f"clip_base_{i}"] = mean_of(runs[EPS_HIGH[0]].series("clip_frac"))
        values[f"acc_base_{i}"], values[f"acc_high_{i}"] = (runs[eps].evals()[-1] for eps in EPS_HIGH)
        for eps, run in runs.items():
            curves[f"ε_high={eps:g}, seed {seed}"] = (range(1, RL_STEPS + 1), plots.rolling(run.series("entropy")))
    values["entropy_start"] = head_mean(runs[EPS_HIGH[0]].series("entropy"), 0.1)
    values["entropy_base_end"] = mean_of([values[f"entropy_base_{i}"] for i in range(1, len(seeds) + 1)])
    values["ratio_min"], values["ratio_max"] = min(ratios), max(ratios)
    values["ratio_mean"] = mean_of(ratios)
    values["clip_base"] = mean_of([values[f"clip_base_{i}"] for i in range(1, len(seeds) + 1)])
    fig, (ax,) = plots.figure(1, width=6.0)
    plots.lines(ax, curves, "entropy of sampled tokens (4 updates per batch, β = 0)", "step",
                "nats / token, 5-step mean")
    return Measured(values, plots.png(fig))


def _judge_clip_higher(v: dict, limits: dict) -> Verdict:
    if v["clip_base"] <= 0:
        return Verdict(DEPENDS, "never_clipped")
    if v["entropy_base_end"] >= v["entropy_start"] * (1 - limits["margin"]):
        return Verdict(DEPENDS, "no_collapse")
    if v["ratio_min"] >= 1 + limits["margin"]:
        return Verdict(HOLDS, "slower")
    if v["ratio_max"] <= 1 - limits["margin"]:
        return Verdict(FAILS, "faster")
    return Verdict(DEPENDS, "within_noise")


CLIP_HIGHER = Claim(
    name="clip_higher_entropy", fast=False,
    papers=("DAPO, Yu et al. 2025, arXiv:2503.14476",),
    text="Clip-higher (ε_high = 0.28 > ε_low = 0.2) slows entropy collapse.",
    criterion="GRPO runs (the pipeline's preset with β = 0 and 4 updates per batch, so that clipping acts) with "
              "ε_high = 0.2 and 0.28, two seeds each, {steps:g} steps. Entropy = mean over the last third of the "
              "steps. It depends if the baseline's entropy did not fall by more than {margin:.0%} from its first "
              "tenth (no collapse to slow). Holds if clip-higher's entropy is higher by more than {margin:.0%} in "
              "every seed; does not hold if lower by more than {margin:.0%} in every seed; else it depends.",
    summary="entropy (last third) ε_high 0.2 → 0.28: seed {seed_1} {entropy_base_1:.3f} → {entropy_high_1:.3f}, "
            "seed {seed_2} {entropy_base_2:.3f} → {entropy_high_2:.3f} (ratio {ratio_min:.2f}–{ratio_max:.2f}); "
            "clip fraction {clip_base:.3f}",
    notes={"slower": "Clip-higher kept {ratio_mean:.2f}× the entropy in both seeds. Only where a batch gets more "
                     "than one update: lmpo's dapo preset makes {dapo_updates_per_batch:g} update per batch, where "
                     "no token is ever clipped.",
           "faster": "Clip-higher ended with less entropy in both seeds (×{ratio_mean:.2f}).",
           "within_noise": "Entropy ratio {ratio_min:.2f}–{ratio_max:.2f} across seeds: no consistent effect at this "
                           "scale ({steps} steps, 1M parameters; entropy started at {entropy_start:.3f}). And with one update "
                           "per batch (lmpo's dapo preset: {dapo_updates_per_batch:g}) clipping never acts at all.",
           "never_clipped": "No token was clipped, so ε_high could not matter.",
           "no_collapse": "Nothing to slow: in {steps} steps the baseline's entropy did not collapse (first tenth "
                          "{entropy_start:.3f}, last third {entropy_base_end:.3f} nats/token). Clip-higher's ratio to it "
                          "was {ratio_min:.2f}–{ratio_max:.2f} across seeds. With one update per batch (lmpo's dapo "
                          "preset: {dapo_updates_per_batch:g}) clipping would not act at all."},
    limits={"margin": 0.05, "steps": RL_STEPS},
    measure=_clip_higher, judge=_judge_clip_higher,
)

CLAIMS = [RATIO_ONE, GSPO, PESSIMISM, CLIP_HIGHER]
