"""The RL loop: generate → score → log-probs → advantages → update.

Every published method (GRPO, Dr. GRPO, DAPO, GSPO, RLOO, REINFORCE++, CISPO, PPO) is a preset
of this loop's parts — an advantage estimator, a policy loss, an aggregation, a KL placement,
optionally a critic and DAPO's batch techniques — chosen by name from the registries in
`lmpo.algos`, never a copy of the loop.
"""

from __future__ import annotations

import json
import resource
import time
import zlib
from dataclasses import asdict
from pathlib import Path

import torch

from lmpo.algos import adaptive_kl_coef
from lmpo.envs import make_task
from lmpo.rollout.evaluation import evaluate
from lmpo.envs.data import load_prompts
from lmpo.rollout.reward_runner import RewardRunner
from lmpo.models import ValueHead, ValueModel, completion_outputs, load_model, load_tokenizer, save_model
from lmpo.rollout import SamplingParams
from lmpo.rollout.agent_loop import EpisodeRunner
from lmpo.trainers.agent_metrics import TrajectoryLog, agent_figures
from lmpo.trainers.termination import TerminationPolicy
from lmpo.trainers.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from lmpo.trainers.faults import fault_point
from lmpo.trainers.progress import StageProgress
from lmpo.trainers.prompts import PromptStream
from lmpo.trainers.preflight import check_rl_inputs
from lmpo.trainers.result import StageResult
from lmpo.trainers.reward_watch import watch_rewards
from lmpo.trainers.rl_batch import Batch, Scored, collect, compute_advantages, make_batch
from lmpo.trainers.rl_config import RLConfig
from lmpo.trainers.rl_update import LossParts, update
from lmpo.trainers.runtime import MetricsLog, make_optimizer, make_scheduler, setup_torch
from lmpo.trainers.run_dir import open_run_dir

__all__ = ["Batch", "RLConfig", "train_rl", "update"]


def train_rl(cfg: RLConfig) -> StageResult:
    cfg.validate()
    started = time.perf_counter()
    out = Path(cfg.resume or cfg.out)
    check_rl_inputs(cfg)
    run = open_run_dir(out, cfg, "rl")
    task = make_task(cfg.task)
    rewards = RewardRunner.from_spec(cfg.rewards, cfg.reward_model, cfg.reward_timeout, cfg.reward_failure)
    rewards = watch_rewards(rewards, out, cfg)
    threads = setup_torch(cfg.threads, cfg.seed)
    tokenizer = load_tokenizer(cfg.model)
    policy = load_model(cfg.model, tokenizer, seed=cfg.seed, keep_dropout=cfg.keep_dropout)
    reference = load_model(cfg.model, tokenizer, seed=cfg.seed).eval().requires_grad_(False) if cfg.beta > 0 else None
    critic = make_critic(cfg, policy, tokenizer)
    parts = LossParts.from_config(cfg, critic)
    optimizer = make_optimizer(policy, cfg.lr, cfg.weight_decay, extra=[(critic, cfg.critic_lr)] if critic else [])
    updates = cfg.steps * cfg.num_iterations * cfg.num_minibatches
    scheduler = make_scheduler(optimizer, cfg.warmup_steps, updates, cfg.lr_schedule, cfg.min_lr_ratio)
    sampler = torch.Generator().manual_seed(cfg.seed)
    stream = PromptStream(_prompt_pool(cfg, task, tokenizer), cfg.seed)
    sampling = SamplingParams(cfg.temperature, cfg.top_p, cfg.top_k, cfg.max_new_tokens)
    runner = EpisodeRunner.for_task(task, policy, tokenizer, sampling, generator=sampler, max_turns=cfg.max_turns,
                                    max_turn_tokens=cfg.max_turn_tokens, max_parse_errors=cfg.max_parse_errors)
    endings = TerminationPolicy.parse(cfg.termination_policy, cfg.termination_penalty, runner.limits.max_turns > 1)
    extra_modules = {"critic": critic} if critic is not None else {}
    beta = cfg.beta

    start_step = nonfinite_streak = 0
    checkpoint = latest_checkpoint(out) if cfg.resume else None
    if cfg.resume and checkpoint is None:
        print(f"[rl] no complete checkpoint in {out}; starting from the beginning")
    if checkpoint is not None:
        resumed = load_checkpoint(checkpoint, policy, optimizer, scheduler, {"sampler": sampler}, extra_modules)
        start_step, stream.position = resumed.step, resumed.state["prompt_position"]
        beta = resumed.state.get("beta", beta)
        nonfinite_streak = resumed.state.get("nonfinite_streak", 0)
        print(f"[rl] resumed from {checkpoint} at step {start_step}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2))
    log = MetricsLog(out / "metrics.jsonl", resume_from_step=start_step if checkpoint else None)
    saved = TrajectoryLog(out / "trajectories.jsonl", tokenizer, cfg.save_trajectories,
                          resume_from_step=start_step if checkpoint else None)
    held = {"policy": 1, "reference": int(reference is not None), "critic": cfg.critic}
    print(f"[rl] {cfg.advantage} advantages, {cfg.loss} loss, {cfg.aggregation}, beta={cfg.beta} "
          f"({cfg.kl_placement}), critic={cfg.critic}; {cfg.prompts_per_step}x{cfg.group_size} samples per step, "
          f"{threads} threads, run dir {out}")

    heldout = _heldout(cfg, task, tokenizer)
    last_eval = None
    if heldout and start_step == 0:  # the starting point of the curves
        first = evaluate(policy, tokenizer, task, heldout, **eval_options(cfg))
        log.write({"step": 0, **first.metrics()})
        saved.write(0, "eval", first.trajectories, task)
    policy.train()
    with StageProgress("rl", cfg.steps, initial=start_step) as progress:
        for step in range(start_step + 1, cfg.steps + 1):
            times: dict[str, float] = {}
            first_prompt = stream.position
            scored = collect(runner, task, stream, rewards, endings, cfg, times)  # generate, score
            fault_point("after_rollout", step)
            tick = time.perf_counter()
            batch = make_batch(scored, cfg, tokenizer.pad_token_id)
            old_log_probs_and_values(batch, reference, critic, policy, cfg)  # π_old is the sampler's own
            if not cfg.mask_observations:
                train_on_observations(batch, scored, policy, cfg)
            times["time_logprobs"] = time.perf_counter() - tick
            tick = time.perf_counter()
            figures = compute_advantages(batch, scored, cfg, beta)
            times["time_advantages"] = time.perf_counter() - tick
            tick = time.perf_counter()
            stats = update(policy, optimizer, scheduler, batch, cfg, parts, beta)
            times["time_update"] = time.perf_counter() - tick
            times["time_step"] = sum(times.values())
            all_skipped = stats["skipped_updates"] == cfg.num_iterations * cfg.num_minibatches
            nonfinite_streak = nonfinite_streak + 1 if all_skipped else 0
            if nonfinite_streak >= cfg.max_nonfinite_steps:
                log.write({"step": step, "skipped_updates": stats["skipped_updates"]})
                raise RuntimeError(f"step {step}: the loss or gradients were not finite in {nonfinite_streak} consecutive "
                                   f"steps; every update was skipped, so the weights are unchanged since step "
                                   f"{step - nonfinite_streak} (see {out / 'metrics.jsonl'})")

            row = {"step": step, **step_figures(scored, batch), **agent_figures(scored.trajectories, runner.limits),
                   "beta": beta, "lr": scheduler.get_last_lr()[0], **figures, **stats, **times}
            saved.write(step, "train", scored.trajectories, task, scored.rewards.tolist(), scored.valid.tolist())
            row["prompts"], row["prompt_digest"] = [first_prompt, stream.position], prompt_digest(scored.problems)
            if cfg.target_kl > 0 and reference is not None:
                observed = figures.get("kl_reward", stats.get("kl", 0.0))
                beta = adaptive_kl_coef(beta, observed, cfg.target_kl, cfg.kl_horizon, len(scored.problems))
            if heldout and (step % cfg.eval_every == 0 or step == cfg.steps):
                last_eval = evaluate(policy, tokenizer, task, heldout, **eval_options(cfg))
                policy.train()
                row.update(last_eval.metrics())
                saved.write(step, "eval", last_eval.trajectories, task)
            log.write(row)
            progress.update(step, reward=row["reward_mean"], acc=row["accuracy"],
                            **({"eval": last_eval.accuracy} if last_eval else {}))
            if cfg.save_every and step % cfg.save_every == 0 and step < cfg.steps:
                save_checkpoint(out, step, policy, tokenizer, optimizer, scheduler, {"sampler": sampler},
                                {"prompt_position": stream.position, "beta": beta, "nonfinite_streak": nonfinite_streak},
                                cfg.keep_checkpoints, extra_modules)
            fault_point("step_end", step)

    rewards.close()
    save_model(policy, tokenizer, out / "model")
    if critic is not None:
        from safetensors.torch import save_model as save_module

        save_module(critic, str(out / "critic.safetensors"))
    result = StageResult(name="rl", seconds=time.perf_counter() - started, model_dir=str(out / "model"), run_dir=str(out))
    if last_eval is not None:
        result.accuracy, result.format_accuracy = last_eval.accuracy, last_eval.format_accuracy
        result.tool_call_rate, result.terminations = last_eval.tool_call_rate, last_eval.terminations
        result.breakdown = last_eval.breakdown or None
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result.write(out / "result.json", config=asdict(cfg), models_held=held, peak_rss_mb=round(peak_mb, 1))
    run.close()
    return result


def _prompt_pool(cfg: RLConfig, task, tokenizer) -> list:
    if not cfg.prompts:
        return task.train_problems(cfg.prompt_pool, cfg.seed)
    problems = load_prompts(cfg.prompts, tokenizer=tokenizer)
    print(f"[rl] {len(problems)} training prompts from {cfg.prompts}")
    return problems


def _heldout(cfg: RLConfig, task, tokenizer) -> list:
    if not cfg.eval_problems:
        return []
    if not cfg.eval_prompts:
        return task.heldout_problems(cfg.eval_problems)
    return load_prompts(cfg.eval_prompts, tokenizer=tokenizer)[: cfg.eval_problems]


def eval_options(cfg: RLConfig) -> dict:
    """Held-out episodes run under the same turn, per-turn and parse-error limits as training."""
    return {"max_new_tokens": cfg.eval_max_new_tokens, "max_turns": cfg.max_turns,
            "max_turn_tokens": cfg.max_turn_tokens, "max_parse_errors": cfg.max_parse_errors}


def make_critic(cfg: RLConfig, policy, tokenizer):
    if cfg.critic == "head":
        return ValueHead(policy.config.hidden_size)
    if cfg.critic == "separate":
        return ValueModel(load_model(cfg.model, tokenizer, seed=cfg.seed, keep_dropout=cfg.keep_dropout))
    return None


@torch.no_grad()
def old_log_probs_and_values(batch: Batch, reference, critic, policy, cfg: RLConfig) -> None:
    """The log-probs phase: reference log-probs (β > 0) and the rollout's values V_old (critic)."""
    if reference is not None:
        batch.ref_logprobs = completion_outputs(reference, batch.prompt_ids, batch.prompt_mask,
                                                batch.completion_ids, cfg.temperature).logprobs
    if isinstance(critic, ValueHead):
        hidden = completion_outputs(policy, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                    cfg.temperature, hidden=True).hidden
        batch.old_values = critic(hidden)
    elif isinstance(critic, ValueModel):
        batch.old_values = critic(batch.prompt_ids, batch.prompt_mask, batch.completion_ids)


@torch.no_grad()
def train_on_observations(batch: Batch, scored, policy, cfg: RLConfig) -> None:
    """The ablation `mask_observations=False`: tool output and template tokens enter the loss as if
    the model had written them (what a framework that forgets the observation mask does); their
    π_old is the policy's own log-prob, since no sampler ever produced them."""
    lengths = scored.rollout.lengths
    real = (torch.arange(batch.completion_ids.size(1))[None, :] < lengths[:, None]).float()
    extra = real * (1 - batch.loss_mask) * scored.trained[:, None].float() * scored.valid[:, None].float()
    if extra.any():
        own = completion_outputs(policy, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                 cfg.temperature).logprobs
        batch.old_logprobs = torch.where(extra.bool(), own, batch.old_logprobs)
        batch.loss_mask = batch.loss_mask + extra


def prompt_digest(problems) -> str:
    """A short fingerprint of the prompts trained on in a step, to compare runs' prompt order."""
    return f"{zlib.crc32(chr(31).join(p.prompt for p in problems).encode()):08x}"


def step_figures(scored: Scored, batch: Batch) -> dict:
    rollout, n = scored.rollout, len(scored.grades)
    valid = scored.valid
    scorable = scored.rewards[valid] if valid.any() else torch.zeros(1)
    figures = {"reward_mean": scorable.mean().item(), "reward_std": scorable.std().item() if len(scorable) > 1 else 0.0,
               **{f"reward_{k}": v[valid].mean().item() if valid.any() else 0.0 for k, v in scored.components.items()},
               "unscorable": int((~valid).sum()), **{f"unscorable_{k}": v for k, v in scored.unscorable.items()},
               "accuracy": sum(g.correct for g in scored.grades) / n,
               "format_accuracy": sum(g.well_formed for g in scored.grades) / n,
               "zero_var_frac": scored.groups_without_signal / max(scored.groups_sampled, 1),
               "groups_sampled": scored.groups_sampled,
               "completion_len_mean": rollout.lengths.float().mean().item(),
               "completion_len_max": int(rollout.lengths.max()),
               "truncated_frac": rollout.truncated.float().mean().item()}
    if batch.old_values is not None:
        figures["value_mean"] = (batch.old_values * batch.loss_mask).sum().item() / batch.loss_mask.sum().clamp(min=1).item()
    return figures
