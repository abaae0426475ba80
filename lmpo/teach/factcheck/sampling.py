"""Claims 1 and 10: what GRPO holds in memory, and DAPO's dynamic sampling on real rollouts."""

from __future__ import annotations

from pathlib import Path

import torch

from lmpo.teach.factcheck import plots
from lmpo.teach.factcheck.context import Context
from lmpo.teach.factcheck.core import DEPENDS, FAILS, HOLDS, Claim, Measured, Verdict
from lmpo.teach.factcheck.kl import BETAS
from lmpo.teach.factcheck.runs import rl_run

# --- 1. GRPO needs no critic ------------------------------------------------------------------------

TINY_BATCH = {"steps": 1, "prompts_per_step": 2, "group_size": 2, "eval_problems": 0}


def stored_parameters(path: Path) -> int:
    """Parameters stored in a safetensors file, or in a model directory's safetensors files."""
    from safetensors.torch import load_file

    files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
    return sum(t.numel() for file in files for t in load_file(str(file)).values())


def _held(ctx: Context) -> Measured:
    values = {}
    for preset in ("grpo", "ppo"):
        run = rl_run(ctx, f"held_{preset}", preset, **TINY_BATCH)
        held = run.result.get("models_held", {})
        policy = stored_parameters(run.out / "model")
        critic_file = run.out / "critic.safetensors"
        critic = stored_parameters(critic_file) if critic_file.is_file() else 0
        values.update({f"{preset}_critic": int(held.get("critic", 0) not in (0, "none", False)),
                       f"{preset}_reference": int(held.get("reference", 0)),
                       f"{preset}_models": 1 + int(held.get("reference", 0)) + int(critic > 0),
                       f"{preset}_params": policy * (1 + int(held.get("reference", 0))) + critic,
                       f"{preset}_critic_params": critic})
    values["saving"] = 1 - values["grpo_params"] / values["ppo_params"]
    return Measured(values)


def _judge_held(v: dict, limits: dict) -> Verdict:
    if v["grpo_critic"] == 0 and v["grpo_critic_params"] == 0 and v["ppo_critic"] == 1:
        return Verdict(HOLDS, "no_critic")
    if v["ppo_critic"] == 0:
        return Verdict(DEPENDS, "no_control")
    return Verdict(FAILS, "critic")


NO_CRITIC = Claim(
    name="grpo_no_critic", fast=False,
    papers=("DeepSeekMath (GRPO), Shao et al. 2024, arXiv:2402.03300", "PPO for RLHF: InstructGPT, Ouyang et al. 2022, "
            "arXiv:2203.02155"),
    text="GRPO needs no critic (value model): the group's mean reward is its baseline.",
    criterion="One-step runs of lmpo's RL trainer with the pipeline's grpo and ppo presets; the models each held "
              "(the trainer's own record) and their stored parameters. Holds if the grpo run built no critic and the "
              "ppo run did.",
    summary="grpo: {grpo_models} models, {grpo_params:,} parameters (critic {grpo_critic_params:,}); ppo: "
            "{ppo_models} models, {ppo_params:,} parameters (critic {ppo_critic_params:,})",
    notes={"no_critic": "GRPO held the policy and (β > 0) the reference, {grpo_params:,} parameters; PPO added a "
                        "{ppo_critic_params:,}-parameter critic: {saving:.0%} fewer parameters without it. With "
                        "β = 0 GRPO holds the policy alone.",
           "critic": "The grpo run built a critic ({grpo_critic_params:,} parameters).",
           "no_control": "The ppo run built no critic either, so the count proves nothing."},
    limits={},
    measure=_held, judge=_judge_held,
)


# --- 10. dynamic sampling raises the share of groups that carry signal ---------------------------------

PROBE_STEPS = 10
MAX_ROUNDS = 32
"""Rounds of 8 prompts dynamic sampling may draw to fill a batch (above lmpo's default of 16, so that
the probe of ten batches never runs out at the SFT start, where many groups are all wrong)."""


def signal_share(ctx: Context, model_dir: str, dynamic: bool) -> tuple[float, float]:
    """(share of the trained batch's groups whose rewards differ, groups sampled per group kept),
    over PROBE_STEPS batches collected by the RL trainer's own `collect`."""
    from lmpo.envs import make_task
    from lmpo.models import load_model, load_tokenizer
    from lmpo.rollout import SamplingParams
    from lmpo.rollout.agent_loop import EpisodeRunner
    from lmpo.rollout.reward_runner import RewardRunner
    from lmpo.algos import groups_with_signal
    from lmpo.trainers.prompts import PromptStream
    from lmpo.trainers.rl_batch import collect
    from lmpo.trainers.termination import TerminationPolicy

    cfg = ctx.stage("rl", "dynamic_sampling_probe", "grpo", model=model_dir, dynamic_sampling=dynamic,
                    max_sampling_rounds=MAX_ROUNDS)
    task = make_task(cfg.task)
    tokenizer = load_tokenizer(cfg.model)
    policy = load_model(cfg.model, tokenizer, seed=cfg.seed, keep_dropout=False)
    runner = EpisodeRunner.for_task(task, policy, tokenizer,
                                    SamplingParams(cfg.temperature, cfg.top_p, cfg.top_k, cfg.max_new_tokens),
                                    generator=torch.Generator().manual_seed(cfg.seed))
    rewards = RewardRunner.from_spec(cfg.rewards, cfg.reward_model, 0, cfg.reward_failure)
    endings = TerminationPolicy.parse(cfg.termination_policy, cfg.termination_penalty, runner.limits.max_turns > 1)
    stream = PromptStream(task.train_problems(cfg.prompt_pool, cfg.seed), cfg.seed)
    kept = with_signal = sampled = 0
    for _ in range(PROBE_STEPS):
        scored = collect(runner, task, stream, rewards, endings, cfg, {})
        signal = groups_with_signal(scored.rewards, scored.group_ids, scored.valid)
        kept += len(scored.group_ids.unique())
        with_signal += len(scored.group_ids[signal].unique())
        sampled += scored.groups_sampled
    rewards.close()
    return with_signal / kept, sampled / kept


def _dynamic_sampling(ctx: Context) -> Measured:
    trained = rl_run(ctx, f"grpo_beta{BETAS[0]:g}", beta=BETAS[0])
    values = {"acc_start": ctx.start().sft_accuracy, "acc_trained": trained.evals()[-1], "steps": PROBE_STEPS}
    for tag, model in (("start", ctx.start().model_dir), ("trained", str(trained.out / "model"))):
        values[f"share_off_{tag}"], _ = signal_share(ctx, model, dynamic=False)
        values[f"share_on_{tag}"], values[f"cost_on_{tag}"] = signal_share(ctx, model, dynamic=True)
    fig, (ax,) = plots.figure(1, width=5.0)
    plots.bars(ax, {"SFT, off": values["share_off_start"], "SFT, on": values["share_on_start"],
                    "GRPO, off": values["share_off_trained"], "GRPO, on": values["share_on_trained"]},
               "share of the batch's groups with reward variance", "share")
    return Measured(values, plots.png(fig))


def _judge_dynamic(v: dict, limits: dict) -> Verdict:
    gains = [v[f"share_on_{t}"] - v[f"share_off_{t}"] for t in ("start", "trained")]
    if min(gains) < -limits["margin"]:
        return Verdict(FAILS, "lower")
    if min(gains) > limits["margin"]:
        return Verdict(HOLDS, "raised")
    if max(gains) > limits["margin"]:
        return Verdict(DEPENDS, "base_rate")
    return Verdict(DEPENDS, "nothing_to_raise")


DYNAMIC = Claim(
    name="dynamic_sampling_signal", fast=False,
    papers=("DAPO, Yu et al. 2025, arXiv:2503.14476",),
    text="Dynamic sampling (drop groups whose rewards are all equal, sample more) raises the share of groups that "
         "carry a learning signal.",
    criterion="The RL trainer's own `collect` with dynamic_sampling off and on, 10 batches of 8 prompts × 8 samples, "
              "from the SFT start and from a GRPO-trained model. Holds if it raises the share of the batch's groups "
              "with reward variance by more than {margin:.0%} at both; depends if only at one; does not hold if it "
              "lowers it.",
    summary="SFT ({acc_start:.0%}): {share_off_start:.0%} → {share_on_start:.0%} at {cost_on_start:.2f}× the "
            "groups sampled; trained ({acc_trained:.0%}): {share_off_trained:.0%} → {share_on_trained:.0%} at "
            "{cost_on_trained:.2f}×",
    notes={"raised": "With it on, every trained group carries signal; the price is {cost_on_start:.2f}× the sampling "
                     "at the SFT start (where {share_off_start:.0%} of groups had signal) and {cost_on_trained:.2f}× "
                     "after GRPO ({share_off_trained:.0%}): about 1 / (share with signal), dearest where few groups "
                     "carry any.",
           "base_rate": "It helps only where many groups are all right or all wrong: {share_off_start:.0%} → "
                        "{share_on_start:.0%} at the start, {share_off_trained:.0%} → {share_on_trained:.0%} after "
                        "training. Depends on the accuracy (and group size).",
           "nothing_to_raise": "Almost every group already had signal ({share_off_start:.0%}, "
                               "{share_off_trained:.0%}): nothing to raise at these accuracies.",
           "lower": "The share fell with dynamic sampling on."},
    limits={"margin": 0.02},
    measure=_dynamic_sampling, judge=_judge_dynamic,
)

CLAIMS = [NO_CRITIC, DYNAMIC]
