"""The RL loop: generate → score → log-probs → advantages → update.

Every published method (GRPO, Dr. GRPO, RLOO, ...) is a preset of this loop's parts — an
advantage estimator, a policy loss, an aggregation and a KL placement, chosen by name from the
registries in `lmpo.algos` — never a copy of the loop.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from lmpo.algos import ADVANTAGES, AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, zero_variance_fraction
from lmpo.envs import REWARDS, decode_completions, encode_prompts, evaluate, grade_all, make_task, parse_reward_weights
from lmpo.models import completion_logprobs, load_model, load_tokenizer, save_model
from lmpo.rollout import Rollout, SamplingParams, generate, left_pad
from lmpo.trainers.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from lmpo.trainers.progress import StageProgress
from lmpo.trainers.prompts import PromptStream
from lmpo.trainers.result import StageResult
from lmpo.trainers.rl_config import RLConfig
from lmpo.trainers.runtime import MetricsLog, grad_norm_and_clip, make_optimizer, make_scheduler, setup_torch


@dataclass
class Batch:
    """One rollout batch, laid out for the loss: prompts left-padded, completions right-padded."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None

    def select(self, index: torch.Tensor) -> "Batch":
        return Batch(**{k: (v[index] if isinstance(v, torch.Tensor) else v) for k, v in vars(self).items()})


def options_for(fn, available: dict) -> dict:
    """The keyword options `fn` accepts, taken from `available` (config values by name)."""
    params = inspect.signature(fn).parameters
    return {k: v for k, v in available.items() if k in params}


def train_rl(cfg: RLConfig) -> StageResult:
    cfg.validate()
    started = time.perf_counter()
    out = Path(cfg.resume or cfg.out)
    task = make_task(cfg.task)
    weights = parse_reward_weights(cfg.rewards)
    advantage_fn = ADVANTAGES.get(cfg.advantage)
    loss_fn = POLICY_LOSSES.get(cfg.loss)
    aggregate = AGGREGATIONS.get(cfg.aggregation)
    kl_fn = KL_ESTIMATORS.get(cfg.kl_estimator)
    options = {"std": cfg.std, "scale": cfg.scale, "clip_eps_low": cfg.clip_eps_low,
               "clip_eps_high": cfg.clip_eps_high, "dual_clip": cfg.dual_clip or None,
               "max_len": cfg.max_len_norm or cfg.max_new_tokens}

    threads = setup_torch(cfg.threads, cfg.seed)
    tokenizer = load_tokenizer(cfg.model)
    policy = load_model(cfg.model, tokenizer, seed=cfg.seed)
    reference = load_model(cfg.model, tokenizer, seed=cfg.seed).eval().requires_grad_(False) if cfg.beta > 0 else None
    updates_per_step = cfg.num_iterations * cfg.num_minibatches
    optimizer = make_optimizer(policy, cfg.lr, cfg.weight_decay)
    scheduler = make_scheduler(optimizer, cfg.warmup_steps, cfg.steps * updates_per_step, cfg.lr_schedule, cfg.min_lr_ratio)
    sampler = torch.Generator().manual_seed(cfg.seed)
    stream = PromptStream(task.train_problems(cfg.prompt_pool, cfg.seed), cfg.seed)
    sampling = SamplingParams(cfg.temperature, cfg.top_p, cfg.top_k, cfg.max_new_tokens)

    start_step = 0
    checkpoint = latest_checkpoint(out) if cfg.resume else None
    if cfg.resume and checkpoint is None:
        print(f"[rl] no complete checkpoint in {out}; starting from the beginning")
    if checkpoint is not None:
        resumed = load_checkpoint(checkpoint, policy, optimizer, scheduler, {"sampler": sampler})
        start_step, stream.position = resumed.step, resumed.state["prompt_position"]
        print(f"[rl] resumed from {checkpoint} at step {start_step}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(_json(asdict(cfg)))
    log = MetricsLog(out / "metrics.jsonl", resume_from_step=start_step if checkpoint else None)
    print(f"[rl] {cfg.advantage} advantages, {cfg.loss} loss, {cfg.aggregation}, beta={cfg.beta}; "
          f"{cfg.prompts_per_step}x{cfg.group_size} samples per step, {threads} threads, run dir {out}")

    heldout = task.heldout_problems(cfg.eval_problems) if cfg.eval_problems else []
    last_eval = None
    policy.train()
    with StageProgress("rl", cfg.steps, initial=start_step) as progress:
        for step in range(start_step + 1, cfg.steps + 1):
            times: dict[str, float] = {}
            tick = time.perf_counter()

            def phase(name: str) -> None:
                nonlocal tick
                now = time.perf_counter()
                times[f"time_{name}"] = now - tick
                tick = now

            # generate
            problems = [p for p in stream.take(cfg.prompts_per_step) for _ in range(cfg.group_size)]
            group_ids = torch.arange(cfg.prompts_per_step).repeat_interleave(cfg.group_size)
            rollout = generate(policy, encode_prompts(tokenizer, problems), sampling, eos_id=tokenizer.eos_token_id,
                               pad_id=tokenizer.pad_token_id, generator=sampler)
            phase("generate")
            # score
            texts, terminated = decode_completions(tokenizer, rollout)
            grades = grade_all(task, problems, texts, terminated)
            components = {name: torch.tensor(REWARDS[name](task, problems, texts, terminated)) for name in weights}
            rewards = sum(w * components[name] for name, w in weights.items())
            phase("score")
            # log-probs (π_old is the sampler's own fp32 log-probs; the reference only when β > 0)
            batch = make_batch(rollout, tokenizer.pad_token_id)
            if reference is not None:
                with torch.no_grad():
                    batch.ref_logprobs, _ = completion_logprobs(reference, batch.prompt_ids, batch.prompt_mask,
                                                                batch.completion_ids, cfg.temperature)
            phase("logprobs")
            # advantages: one per sequence, broadcast over its tokens
            seq_adv = advantage_fn(rewards, group_ids, **options_for(advantage_fn, options))
            batch.advantages = seq_adv[:, None].expand_as(batch.loss_mask).contiguous()
            phase("advantages")
            # update
            stats = update(policy, optimizer, scheduler, batch, cfg, loss_fn, aggregate, kl_fn, options)
            phase("update")

            times["time_step"] = sum(times.values())
            row = {"step": step, "reward_mean": rewards.mean().item(), "reward_std": rewards.std().item(),
                   **{f"reward_{k}": v.mean().item() for k, v in components.items()},
                   "accuracy": sum(g.correct for g in grades) / len(grades),
                   "format_accuracy": sum(g.well_formed for g in grades) / len(grades),
                   "zero_var_frac": zero_variance_fraction(rewards, group_ids),
                   "completion_len_mean": rollout.lengths.float().mean().item(),
                   "completion_len_max": int(rollout.lengths.max()),
                   "truncated_frac": rollout.truncated.float().mean().item(),
                   "lr": scheduler.get_last_lr()[0], **stats, **times}
            if heldout and (step % cfg.eval_every == 0 or step == cfg.steps):
                ev = evaluate(policy, tokenizer, task, heldout, max_new_tokens=cfg.eval_max_new_tokens)
                policy.train()
                row["eval_accuracy"], row["eval_format_accuracy"] = ev.accuracy, ev.format_accuracy
                last_eval = ev
            log.write(row)
            progress.update(step, reward=row["reward_mean"], acc=row["accuracy"],
                            **({"eval": last_eval.accuracy} if last_eval else {}))
            if cfg.save_every and step % cfg.save_every == 0 and step < cfg.steps:
                save_checkpoint(out, step, policy, tokenizer, optimizer, scheduler, {"sampler": sampler},
                                {"prompt_position": stream.position}, keep_last=cfg.keep_checkpoints)

    save_model(policy, tokenizer, out / "model")
    result = StageResult(name="rl", seconds=time.perf_counter() - started, model_dir=str(out / "model"), run_dir=str(out))
    if last_eval is not None:
        result.accuracy, result.format_accuracy = last_eval.accuracy, last_eval.format_accuracy
    result.write(out / "result.json", config=asdict(cfg))
    return result


def make_batch(rollout: Rollout, pad_id: int) -> Batch:
    prompt_ids, prompt_mask = left_pad(rollout.prompt_ids, pad_id)
    return Batch(prompt_ids, prompt_mask, rollout.completion_ids, rollout.loss_mask, rollout.logprobs)


def update(policy, optimizer, scheduler, batch: Batch, cfg: RLConfig, loss_fn, aggregate, kl_fn, options) -> dict:
    """`num_iterations` passes over the batch, each split into `num_minibatches` optimizer steps,
    each accumulated over micro-batches with the minibatch's global denominators."""
    size = batch.completion_ids.size(0)
    mb_size = size // cfg.num_minibatches
    micro = cfg.micro_batch_size or mb_size
    sums = {"loss": 0.0, "clip_frac": 0.0, "kl": 0.0, "entropy": 0.0, "grad_norm": 0.0}
    order_gen = torch.Generator().manual_seed(cfg.seed)
    for _ in range(cfg.num_iterations):
        order = torch.randperm(size, generator=order_gen) if cfg.num_minibatches > 1 else torch.arange(size)
        for start in range(0, size, mb_size):
            minibatch = batch.select(order[start:start + mb_size])
            counts = {"num_sequences": int((minibatch.loss_mask.sum(dim=1) > 0).sum()),
                      "num_tokens": minibatch.loss_mask.sum().item(), "max_len": options["max_len"]}
            optimizer.zero_grad(set_to_none=True)
            for m_start in range(0, mb_size, micro):
                part = minibatch.select(torch.arange(m_start, min(m_start + micro, mb_size)))
                stats = micro_step(policy, part, cfg, loss_fn, aggregate, kl_fn, options, counts)
                for key, value in stats.items():
                    sums[key] += value
            sums["grad_norm"] += grad_norm_and_clip(policy, cfg.grad_clip)
            optimizer.step()
            scheduler.step()
    updates = cfg.num_iterations * cfg.num_minibatches
    stats = {k: v / updates for k, v in sums.items()}
    if cfg.beta == 0:
        stats.pop("kl")
    return stats


def micro_step(policy, part: Batch, cfg: RLConfig, loss_fn, aggregate, kl_fn, options, counts) -> dict:
    """Forward, loss and backward for one micro-batch; returns its share of the figures."""
    logprobs, entropy = completion_logprobs(policy, part.prompt_ids, part.prompt_mask, part.completion_ids,
                                            cfg.temperature, with_entropy=True)
    token_loss, info = loss_fn(logprobs, part.old_logprobs, part.advantages, part.loss_mask,
                               **options_for(loss_fn, options))
    kl = None
    if part.ref_logprobs is not None:
        kl = kl_fn(logprobs, part.ref_logprobs)
        token_loss = token_loss + cfg.beta * torch.where(part.loss_mask.bool(), kl, torch.zeros_like(kl))
    agg = options_for(aggregate, counts)
    loss = aggregate(token_loss, part.loss_mask, **agg)
    loss.backward()
    share = {"loss": loss.item()}
    for name, per_token in (("clip_frac", info["clipped"]), ("entropy", entropy), ("kl", kl)):
        share[name] = 0.0 if per_token is None else (per_token.detach() * part.loss_mask).sum().item() / counts["num_tokens"]
    return share


def _json(obj) -> str:
    import json
    return json.dumps(obj, indent=2, default=str)
