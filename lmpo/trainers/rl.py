"""The RL loop: generate → score → log-probs → advantages → update.

Every published method (GRPO, Dr. GRPO, DAPO, GSPO, RLOO, REINFORCE++, CISPO, PPO) is a preset
of this loop's parts — an advantage estimator, a policy loss, an aggregation, a KL placement,
optionally a critic and DAPO's batch techniques — chosen by name from the registries in
`lmpo.algos`, never a copy of the loop.
"""

from __future__ import annotations

import json
import time
import zlib
from dataclasses import asdict
from pathlib import Path

import torch

from lmpo.algos import adaptive_kl_coef
from lmpo.envs import make_task
from lmpo.rollout.evaluation import evaluate
from lmpo.rollout.reward_runner import RewardRunner
from lmpo.models import ValueHead, ValueModel, completion_outputs, load_model, load_tokenizer
from lmpo.models.memory import critic_description
from lmpo.rollout import SamplingParams
from lmpo.rollout.agent_loop import EpisodeRunner
from lmpo.rollout.engine_select import check_engine, make_engine
from lmpo.rollout.weight_probe import default_probe_ids
from lmpo.trainers.agent_metrics import TrajectoryLog, training_records
from lmpo.trainers.termination import TerminationPolicy
from lmpo.trainers.faults import fault_point
from lmpo.trainers.distributed import Distributed, launched_rank
from lmpo.trainers.harness import Run, Updater, preflight_run
from lmpo.trainers.prompts import PromptStream, heldout_prompts, training_prompts
from lmpo.trainers.ptx import ptx_batches, ptx_state, restore_ptx
from lmpo.trainers.preflight import load_prompt_files
from lmpo.trainers.result import StageResult
from lmpo.trainers.reward_watch import watch_rewards
from lmpo.trainers.rl_batch import Batch, collect, compute_advantages, make_batch
from lmpo.trainers.rl_figures import step_figures
from lmpo.trainers.rl_config import RLConfig
from lmpo.trainers.rl_update import LossParts, update
from lmpo.trainers.runtime import make_optimizer, make_scheduler
from lmpo.trainers.checkpoint import complete_checkpoints, load_checkpoint
from lmpo.trainers.run_clock import STATE_KEY
from lmpo.trainers.collapse_guard import CollapseGuard, CollapseGuardStop, scale_learning_rate
from lmpo.trainers.stopping import BestWeights, StopRule
from lmpo.trainers.validation import raise_if_any, single_turn_problems
from lmpo.trainers.sampler_mismatch import (correct_for_sampler, recompute_logprobs, samples_with_trainer_forward,
                                            sync_and_probe)

SAMPLER_STRIDE = 1_000_003  # each data-parallel process samples from its own stream

__all__ = ["Batch", "RLConfig", "train_rl", "update"]


def train_rl(cfg: RLConfig) -> StageResult:
    cfg.validate()
    loaded = load_prompt_files(cfg)  # the prompt files, before anything is written or loaded
    task = make_task(cfg.task)  # a bad task option, too
    raise_if_any("RL", single_turn_problems(cfg, task))
    check_engine(cfg.engine)  # engine=vllm where vLLM cannot run
    preflight_run(cfg, "rl")
    # the prompts and reward functions before the run directory: a task without a held-out split
    # or a reward module that does not import says so before anything is written or loaded
    stopping = StopRule.from_options(cfg, higher_is_better=True).active
    heldout, selection = heldout_and_selection(cfg, task, loaded, stopping, "rl") if launched_rank() == 0 else ([], [])
    pool = training_prompts(task, loaded, cfg.prompts, cfg.prompt_pool, cfg.seed, "rl")
    rewards = RewardRunner.from_spec(cfg.rewards, cfg.reward_model, cfg.reward_timeout, cfg.reward_failure)
    run = Run(cfg, "rl")
    rewards = watch_rewards(rewards, run.out, cfg, run.dist)
    # the wall-time cap counts from here, as the run's own clock does, not from before the prompts
    stop, best = StopRule.from_options(cfg, higher_is_better=True), BestWeights(run.out / "best")
    tokenizer = load_tokenizer(cfg.model, cfg.trust_remote_code, cfg.chat_template, cfg.chat_template_kwargs)
    ptx = ptx_batches(cfg, task, tokenizer)  # PPO-ptx: None when ptx_coef is 0
    policy = run.load_policy(tokenizer, keep_dropout=cfg.keep_dropout)
    reference = run.reference(policy, lambda: load_model(cfg.model, tokenizer, seed=cfg.seed,
                                                          trust_remote_code=cfg.trust_remote_code)) if cfg.beta > 0 else None
    critic = make_critic(cfg, policy, tokenizer, run.lora)
    critic = critic.to(run.device) if critic is not None else None
    parts = LossParts.from_config(cfg, run.trained(critic) if critic is not None else None)
    optimizer = make_optimizer(policy, cfg.lr, cfg.weight_decay, extra=[(critic, cfg.critic_lr)] if critic else [])
    updates = cfg.steps * cfg.num_iterations * cfg.num_minibatches
    scheduler = make_scheduler(optimizer, cfg.warmup_steps, updates, cfg.lr_schedule, cfg.min_lr_ratio)
    updater = Updater(optimizer, scheduler, cfg.grad_clip, cfg.max_nonfinite_steps, "rl")
    sampler = torch.Generator().manual_seed(cfg.seed + SAMPLER_STRIDE * run.dist.rank)
    stream = PromptStream(pool, cfg.seed)
    sampling = SamplingParams(cfg.temperature, cfg.top_p, cfg.top_k, cfg.max_new_tokens)
    engine = make_engine(cfg.engine, run.plain(policy), tokenizer, cfg.model, generator=sampler, seed=cfg.seed,
                         trainer_device=str(run.device), gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
                         enable_lora=run.lora is not None, log=run.say, trust_remote_code=cfg.trust_remote_code)
    external = not samples_with_trainer_forward(engine)  # a sampler whose log-probs are not the trainer's
    probe_ids = default_probe_ids(tokenizer)
    runner = EpisodeRunner.for_task(task, run.plain(policy), tokenizer, sampling, generator=sampler,
                                    max_turns=cfg.max_turns,
                                    max_turn_tokens=cfg.max_turn_tokens, max_parse_errors=cfg.max_parse_errors,
                                    engine=engine)
    endings = TerminationPolicy.parse(cfg.termination_policy, cfg.termination_penalty, runner.limits.max_turns > 1)
    extra_modules = {"critic": critic} if critic is not None else {}
    beta = cfg.beta

    guard = CollapseGuard(cfg) if cfg.collapse_guard else None
    start_step = nonfinite_streak = 0
    env_rewards = False  # the environment has given a reward in this run: reward_env is logged every step
    resumed = run.resume(policy, optimizer, scheduler, {"sampler": sampler}, extra_modules)
    if resumed is not None:
        start_step, stream.position = resumed.step, resumed.state["prompt_position"]
        beta = resumed.state.get("beta", beta)
        nonfinite_streak = resumed.state.get("nonfinite_steps", 0)
        env_rewards = resumed.state.get("env_rewards", False)
        stop.load_state(resumed.state.get("stopping", {}))
        if guard is not None:
            guard.load_state(resumed.state.get("guard", {}))
        restore_ptx(ptx, resumed.data)
    if external:  # after the checkpoint: the engine samples the weights training continues from
        sync_and_probe(engine, run.plain(policy), probe_ids, cfg.probe_tolerance)
    if run.dist.is_main:
        (run.out / "config.json").write_text(json.dumps(asdict(cfg), indent=2))
    saved = TrajectoryLog(run.out / "trajectories.jsonl" if run.dist.is_main else None, tokenizer,
                          cfg.save_trajectories, resume_from_step=start_step if resumed else None)
    held = {"policy": 1, "reference": int(reference is not None and run.lora is None), "critic": cfg.critic}
    run.say(f"{cfg.advantage} advantages, {cfg.loss} loss, {cfg.aggregation}, beta={cfg.beta} ({cfg.kl_placement}), "
            f"critic={cfg.critic}{critic_description(critic)}; {cfg.prompts_per_step}x{cfg.group_size} samples "
            f"per step of at most {cfg.max_new_tokens} tokens{' an episode' if runner.limits.max_turns > 1 else ''}; "
            f"{run.describe(policy)}")

    last_eval, last_eval_step = None, -1

    def held_out_eval(step: int) -> dict:
        """Evaluate on the reported held-out set; the stopping rule judges on the selection set."""
        nonlocal last_eval, last_eval_step
        last_eval = evaluate(run.plain(policy), tokenizer, task, heldout, **eval_options(cfg))
        figures = {**last_eval.metrics(), "elapsed_s": run.elapsed()}
        saved.write(step, "eval", last_eval.trajectories, task)
        last_eval_step = step
        if stop.active:
            score = last_eval.accuracy
            if selection:
                score = figures["eval_select_accuracy"] = evaluate(run.plain(policy), tokenizer, task, selection,
                                                              **eval_options(cfg)).accuracy
            if stop.observe(step, score):
                best.keep(run.plain(policy), tokenizer)
        policy.train()
        return figures

    if heldout and resumed is None:  # the starting point of the curves
        run.write({"step": 0, **held_out_eval(0)})
    policy.train()
    trained = run.trained(policy)

    def write_checkpoint(step: int) -> None:
        run.checkpoint(step, policy, tokenizer, optimizer, scheduler, {"sampler": sampler},
                       {"prompt_position": stream.position, "beta": beta, "nonfinite_steps": nonfinite_streak,
                        "env_rewards": env_rewards,
                        "stopping": stop.state(), **({"guard": guard.state()} if guard else {})},
                       extra_modules, data_state=ptx_state(ptx))

    if guard is not None and resumed is None:  # the start, for the guard to go back to if step 1 breaks the policy
        write_checkpoint(0)
    step = start_step
    with run.progress(cfg.steps, initial=start_step) as progress:
        while step < cfg.steps:
            step += 1
            times: dict[str, float] = {}
            first_prompt = stream.position
            scored = collect(runner, task, stream, rewards, endings, cfg, times, run.dist)  # generate, score
            fault_point("after_rollout", step)
            tick = time.perf_counter()
            batch = make_batch(scored, cfg, tokenizer.pad_token_id)
            mismatch: dict[str, float] = {}
            with run.autocast():
                old_log_probs_and_values(batch, reference, critic, policy, cfg, policy_logprobs=not external)
                if external:  # π_old from the trainer's forward; the sampler's gap by truncated importance weights
                    trainer_lp = recompute_logprobs(run.plain(policy), batch.prompt_ids.to(run.device),
                                                    batch.prompt_mask.to(run.device),
                                                    batch.completion_ids.to(run.device), cfg.temperature,
                                                    cfg.micro_batch_size).cpu()
                    batch.old_logprobs, batch.tis_weights, mismatch = correct_for_sampler(
                        batch.old_logprobs, trainer_lp, batch.loss_mask, cfg.tis_cap)
                if not cfg.mask_observations:
                    train_on_observations(batch, scored, run.plain(policy), cfg)
            times["time_logprobs"] = time.perf_counter() - tick
            tick = time.perf_counter()
            figures = compute_advantages(batch, scored, cfg, beta, run.dist)
            times["time_advantages"] = time.perf_counter() - tick
            tick = time.perf_counter()
            stats = update(trained, updater, batch, cfg, parts, beta, run.dist, run.autocast, ptx)
            run.sync(policy)  # FSDP: the sampling copy takes the new weights
            times["time_update"] = time.perf_counter() - tick
            if external:
                tick = time.perf_counter()
                mismatch.update(sync_and_probe(engine, run.plain(policy), probe_ids, cfg.probe_tolerance))
                times["time_sync"] = time.perf_counter() - tick
            times["time_step"] = sum(times.values())
            all_skipped = stats["skipped_updates"] == cfg.num_iterations * cfg.num_minibatches
            nonfinite_streak = nonfinite_streak + 1 if all_skipped else 0
            if nonfinite_streak >= cfg.max_nonfinite_steps and guard is None:
                run.write({"step": step, "skipped_updates": stats["skipped_updates"]})
                updater.check(step, nonfinite_streak)

            row = {"step": step, **step_figures(scored, batch, run.dist, runner.limits),
                   "beta": beta, "lr": updater.lr, **figures, **stats, **mismatch, **times}
            env_rewards = env_rewards or "reward_env" in row
            if env_rewards:  # a step whose episodes all ended before any reward: 0, not a gap in the curve
                row.setdefault("reward_env", 0.0)
            saved.write(step, "train", scored.trajectories, task, scored.rewards.tolist(), scored.valid.tolist(),
                        training_records(endings.actions([t.termination for t in scored.trajectories]),
                                         batch.loss_mask))
            shares = run.dist.gather([p.prompt for p in scored.problems])  # the digest covers the global batch
            row["prompts"], row["prompt_digest"] = [first_prompt, stream.position], prompt_digest(shares)
            observed = figures.get("kl_reward", stats.get("kl"))  # None: no trained token to measure it on
            if cfg.target_kl > 0 and reference is not None and observed is not None:
                beta = adaptive_kl_coef(beta, observed, cfg.target_kl, cfg.kl_horizon, cfg.prompts_per_step * cfg.group_size)
            if heldout and (step % cfg.eval_every == 0 or step == cfg.steps):
                row.update(held_out_eval(step))
            reason = run.dist.broadcast(stop.reason()) if stop.active else None
            if reason and heldout and last_eval_step != step:  # a wall-time cap between evaluations
                row.update(held_out_eval(step))
            run.write(row)
            alarm = guard.check(row, nonfinite_streak, cfg.max_nonfinite_steps) if guard is not None else None
            if alarm:  # back to the last complete checkpoint, with a lower learning rate
                checkpoint = guard.target(complete_checkpoints(run.out), step)
                if checkpoint is None:
                    raise CollapseGuardStop(f"collapse guard at step {step}: {alarm}; no checkpoint to roll back to "
                                            f"(the alarm came back from the oldest one); start again with a lower --lr")
                scale = guard.rolled_back()
                back = load_checkpoint(checkpoint, policy, optimizer, scheduler, {"sampler": sampler}, extra_modules,
                                       run.dist.rank)
                scale_learning_rate(optimizer, scheduler, scale / back.state.get("guard", {}).get("lr_scale", 1.0))
                restore_ptx(ptx, back.data)
                run.sync(policy)
                stream.position, beta, nonfinite_streak = back.state["prompt_position"], back.state["beta"], 0
                run.say(f"collapse guard at step {step}: {alarm}; rolled back to step {back.step}, lr x{scale:g}")
                # the clock at the rollback and at the checkpoint: the abandoned branch's wall time (`lmpo compare`)
                run.write({"step": step, "rollback": alarm, "to_step": back.step, "lr_scale": scale,
                           "new_lr": optimizer.param_groups[0]["lr"], "elapsed_s": run.elapsed(),
                           "to_elapsed_s": back.state.get(STATE_KEY)})
                step = back.step
                continue
            progress.update(step, reward=row.get("reward_mean"), acc=row["accuracy"],
                            **({"eval": row["eval_accuracy"]} if "eval_accuracy" in row else {}))  # this step's only
            if reason:
                run.say(f"stopping at step {step}: {reason}; keeping the model of step {stop.best_step}")
                run.write({"step": step, "stopped": reason, "best_step": stop.best_step})
                break
            if run.checkpoint_due(step, cfg.steps):
                write_checkpoint(step)
            fault_point("step_end", step)

    rewards.close()
    getattr(engine, "close", lambda: None)()
    result = StageResult(name="rl", seconds=0.0, model_dir="", run_dir=str(run.out))
    run.dist.barrier()
    if stop.active and stop.best_step != last_eval_step and best.restore(policy):
        run.sync(policy)  # the next stage starts from the best model: evaluate that one
        last_eval = evaluate(run.plain(policy), tokenizer, task, heldout, **eval_options(cfg)) if heldout else None
        run.say(f"the model of step {stop.best_step} is the stage's model")
    if last_eval is not None:
        result.accuracy, result.format_accuracy = last_eval.accuracy, last_eval.format_accuracy
        result.tool_call_rate, result.terminations = last_eval.tool_call_rate, last_eval.terminations
        result.breakdown = last_eval.breakdown or None
    return run.finish(policy, tokenizer, result, extra_files=[_critic_writer(critic)] if critic is not None else None,
                      models_held=held)


def _critic_writer(critic):
    def write(out: Path) -> None:
        from safetensors.torch import save_model as save_module

        save_module(critic, str(out / "critic.safetensors"))
    return write


def heldout_and_selection(cfg: RLConfig, task, loaded: dict, stopping: bool, tag: str = "") -> tuple[list, list]:
    """The reported held-out problems and, with a stopping rule, the disjoint ones it selects on
    (`tag`: see `heldout_prompts`)."""
    if not cfg.eval_problems:
        return [], []
    wanted = cfg.eval_problems + (cfg.select_problems if stopping else 0)
    try:
        problems = heldout_prompts(task, loaded, cfg.eval_prompts, wanted, tag)
    except ValueError as err:
        if cfg.eval_prompts or wanted == cfg.eval_problems:
            raise
        raise ValueError(f"{err} (eval_problems={cfg.eval_problems} reported + select_problems="
                         f"{cfg.select_problems} for the stopping rule: lower either)") from None
    if cfg.eval_prompts and stopping and cfg.select_problems and len(problems) <= cfg.eval_problems:
        raise ValueError(f"{cfg.eval_prompts}: {len(problems)} rows, all of them reported (eval_problems="
                         f"{cfg.eval_problems}); the stopping rule needs select_problems={cfg.select_problems} "
                         f"more to pick the best model on, or select_problems=0 to pick on the reported ones")
    return problems[: cfg.eval_problems], problems[cfg.eval_problems:]


def eval_options(cfg: RLConfig) -> dict:
    """Held-out episodes run under the same turn, per-turn and parse-error limits as training."""
    return {"max_new_tokens": cfg.eval_max_new_tokens, "max_turns": cfg.max_turns,
            "max_turn_tokens": cfg.max_turn_tokens, "max_parse_errors": cfg.max_parse_errors,
            "budget_option": "--eval_max_new_tokens"}


def make_critic(cfg: RLConfig, policy, tokenizer, lora=None):
    if cfg.critic == "head":
        return ValueHead(policy.config.hidden_size)
    if cfg.critic == "separate":  # under LoRA with its own adapter: a fully trained copy undid LoRA's memory saving
        return ValueModel(load_model(cfg.model, tokenizer, seed=cfg.seed, keep_dropout=cfg.keep_dropout,
                                      lora=lora, trust_remote_code=cfg.trust_remote_code))
    return None


@torch.no_grad()
def old_log_probs_and_values(batch: Batch, reference, critic, policy, cfg: RLConfig,
                             policy_logprobs: bool = True) -> None:
    """The log-probs phase: reference log-probs (β > 0), the rollout's values V_old (critic) and
    the policy's own log-probs from the same kind of forward as the reference's, for a KL reward
    penalty and, when several updates share the batch, as π_old (`policy_logprobs` False: the
    caller recomputes them anyway). Computed on the models' device; the batch stays on the CPU
    until the update."""
    on_device = batch.to(next(policy.parameters()).device)
    inputs = (on_device.prompt_ids, on_device.prompt_mask, on_device.completion_ids)
    head = isinstance(critic, ValueHead)
    several_updates = batch.on_policy and cfg.num_iterations * cfg.num_minibatches > 1
    own = policy_logprobs and (several_updates or (reference is not None and cfg.kl_placement == "reward"))
    # packed when it pays; padded when the policy's log-probs come with the value head's hidden
    # states (always padded), so that both sides of the penalty are the same computation
    lengths = on_device.real_completion_lengths() if cfg.mask_observations and not (own and head) else None
    if reference is not None:
        batch.ref_logprobs = completion_outputs(reference, *inputs, cfg.temperature, lengths=lengths,
                                                chunk_tokens=cfg.logprob_chunk_tokens).logprobs.float().cpu()
    if head:
        outputs = completion_outputs(policy, *inputs, cfg.temperature, hidden=True,
                                     chunk_tokens=cfg.logprob_chunk_tokens)
        batch.old_values = critic(outputs.hidden).float().cpu()
        if own:
            batch.policy_logprobs = outputs.logprobs.float().cpu()
    elif own:
        batch.policy_logprobs = completion_outputs(policy, *inputs, cfg.temperature, lengths=lengths,
                                                   chunk_tokens=cfg.logprob_chunk_tokens).logprobs.float().cpu()
    if isinstance(critic, ValueModel):
        batch.old_values = critic(*inputs).float().cpu()
    if several_updates and batch.policy_logprobs is not None:
        # π_old for the updates after the first (whose π_old is its own forward's): the trainer's
        # forward before the first one. The sampler's log-probs differ from it by float error
        # (much more in bf16), which the ratio would otherwise show and clip.
        batch.old_logprobs = batch.policy_logprobs


@torch.no_grad()
def train_on_observations(batch: Batch, scored, policy, cfg: RLConfig) -> None:
    """The ablation `mask_observations=False`: tool output and template tokens enter the loss as if
    the model had written them (what a framework that forgets the observation mask does); their
    π_old is the policy's own log-prob, since no sampler ever produced them."""
    lengths = scored.rollout.lengths
    real = (torch.arange(batch.completion_ids.size(1))[None, :] < lengths[:, None]).float()
    extra = real * (1 - batch.loss_mask) * scored.trained[:, None].float() * scored.valid[:, None].float()
    if extra.any():
        device = next(policy.parameters()).device
        own = completion_outputs(policy, batch.prompt_ids.to(device), batch.prompt_mask.to(device),
                                 batch.completion_ids.to(device), cfg.temperature,
                                 chunk_tokens=cfg.logprob_chunk_tokens).logprobs.float().cpu()
        batch.old_logprobs = torch.where(extra.bool(), own, batch.old_logprobs)
        batch.loss_mask = batch.loss_mask + extra
        if batch.tis_weights is not None:  # the added tokens were never sampled: no correction
            batch.tis_weights = torch.where(extra.bool(), 1.0, batch.tis_weights)


def prompt_digest(shares: list[list[str]]) -> str:
    """A short fingerprint of the prompts trained on in a step, to compare runs' prompt order:
    every process's share in rank order, the global batch's order (one process's value)."""
    return f"{zlib.crc32(chr(31).join(p for share in shares for p in share).encode()):08x}"
