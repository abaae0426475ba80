"""Offline preference optimisation (DPO, cDPO, IPO, SimPO) on (prompt, chosen, rejected) pairs.

The reference model's log-probs are computed once, up front, and the reference is then
released, so only the policy stays in memory while training.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch

from lmpo.algos import PREFERENCE_LOSSES
from lmpo.envs import make_task
from lmpo.rollout.evaluation import evaluate
from lmpo.envs.data import PreferencePair
from lmpo.models import completion_outputs, load_model, load_tokenizer, save_model
from lmpo.rollout import left_pad, right_pad
from lmpo.trainers.checkpoint import resume_training, save_checkpoint
from lmpo.trainers.faults import fault_point
from lmpo.trainers.pairs import embedded_pairs, file_pairs
from lmpo.trainers.progress import StageProgress
from lmpo.trainers.result import StageResult
from lmpo.trainers.run_dir import open_run_dir
from lmpo.trainers.validation import (at_least, checkpoint_problems, data_option_problems, optimizer_problems,
                                     preference_option_problems, raise_if_any)
from lmpo.trainers.runtime import (MetricsLog, Schedule, backward_and_step, make_optimizer, make_scheduler,
                                   options_for, setup_torch)


@dataclass
class PreferenceConfig:
    model: str = "runs/sft/model"
    """Hugging Face model directory of the policy to start from; also the reference."""
    task: str = "sort_digits"
    """Task that supplies the embedded preference pairs and the held-out evaluation."""
    out: str = "runs/dpo"
    """Run directory: metrics.jsonl, checkpoints/, the final model in `model/`, result.json."""
    resume: str = ""
    """Run directory of an interrupted run to continue from its newest complete checkpoint; repeat its options."""
    seed: int = 0
    """Seed for the pairs and their order."""
    threads: int = 2
    """Torch CPU threads (0 = one per core)."""
    loss: str = "dpo"
    """Preference loss: dpo, cdpo, ipo or simpo (reference-free)."""
    beta: float = 0.1
    """Strength of the implicit KL to the reference (DPO's beta)."""
    label_smoothing: float = 0.1
    """cdpo: assumed probability that a pair's label is flipped."""
    gamma: float = 0.5
    """simpo: target reward margin (in reward units, after beta)."""
    pairs: int = 2000
    """Training pairs drawn from the task's training split."""
    epochs: int = 1
    """Passes over the pairs."""
    batch_size: int = 32
    """Pairs per optimizer step."""
    lr: float = 5e-5
    """Peak learning rate of AdamW."""
    warmup_steps: int = 5
    """Steps of linear warm-up."""
    lr_schedule: Schedule = "cosine"
    """Decay after warm-up: cosine, linear or constant."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of the peak."""
    weight_decay: float = 0.0
    """AdamW weight decay (matrices only)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 = off)."""
    keep_dropout: bool = False
    """Keep the model's dropout on while training; by default it is off, so the policy and the reference score a pair alike and the first DPO loss is ln 2."""
    eval_problems: int = 500
    """Held-out problems for greedy task accuracy at the start and the end (0 = skip)."""
    eval_max_new_tokens: int = 12
    """Token limit for evaluation answers."""
    log_every: int = 5
    """Write a metrics row every this many steps."""
    save_every: int = 50
    """Write a resumable checkpoint every this many steps (0 = only the final model)."""
    keep_checkpoints: int = 2
    """Complete checkpoints to keep."""
    data: str = ""
    """Train on the pairs of this file instead of the task's: JSONL, Parquet or a `datasets` directory (`DIR::split`) with `prompt`, `chosen`, `rejected` (strings, or message lists rendered with the chat template)."""
    max_length: int = 1024
    """Longest pair from `data` (prompt + longer reply), in tokens."""
    overlong: Literal["error", "skip", "truncate"] = "error"
    """What to do with a longer pair from `data`: stop with an error naming it, skip it, or truncate the replies."""

    def validate(self) -> None:
        raise_if_any("preference", preference_problems(self))


def preference_problems(cfg: PreferenceConfig) -> list[str]:
    problems = at_least(cfg, 1, "batch_size", "epochs", "pairs", "log_every", "max_length")
    problems += at_least(cfg, 0, "eval_problems") + optimizer_problems(cfg) + checkpoint_problems(cfg)
    if cfg.loss not in PREFERENCE_LOSSES:
        problems.append(f"loss={cfg.loss!r} is not one of {PREFERENCE_LOSSES.names()}")
    if not cfg.beta > 0:
        problems.append(f"beta={cfg.beta} must be > 0")
    if not 0 <= cfg.label_smoothing < 0.5:
        problems.append(f"label_smoothing={cfg.label_smoothing} must be in [0, 0.5)")
    return problems + preference_option_problems(cfg) + data_option_problems(cfg)


@dataclass
class EncodedPairs:
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    chosen: torch.Tensor
    chosen_mask: torch.Tensor
    rejected: torch.Tensor
    rejected_mask: torch.Tensor


def encode_pairs(pairs: list[PreferencePair], pad_id: int) -> EncodedPairs:
    return encode_pair_ids([p.prompt_ids for p in pairs], [p.chosen_ids for p in pairs],
                           [p.rejected_ids for p in pairs], pad_id)


def encode_pair_ids(prompts: list[list[int]], chosen: list[list[int]], rejected: list[list[int]],
                    pad_id: int) -> EncodedPairs:
    """Prompts left-padded; chosen and rejected completions right-padded with loss masks."""
    prompt_ids, prompt_mask = left_pad(prompts, pad_id)
    chosen_ids, chosen_mask = right_pad(chosen, pad_id)
    rejected_ids, rejected_mask = right_pad(rejected, pad_id)
    return EncodedPairs(prompt_ids, prompt_mask, chosen_ids, chosen_mask.float(), rejected_ids, rejected_mask.float())


def sequence_logps(model, enc: EncodedPairs) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed completion log-probs of the chosen and rejected answers [B] each."""
    chosen = completion_outputs(model, enc.prompt_ids, enc.prompt_mask, enc.chosen).logprobs
    rejected = completion_outputs(model, enc.prompt_ids, enc.prompt_mask, enc.rejected).logprobs
    return (chosen * enc.chosen_mask).sum(1), (rejected * enc.rejected_mask).sum(1)


def preference_step(policy, optimizer, scheduler, enc: EncodedPairs, ref, loss_fn, cfg, options: dict) -> dict:
    """One optimizer step of a preference loss on a batch of pairs; returns its figures."""
    chosen, rejected = sequence_logps(policy, enc)
    ref_chosen, ref_rejected = ref if ref is not None else (None, None)
    loss, figures = loss_fn(chosen, rejected, ref_chosen, ref_rejected, beta=cfg.beta,
                            chosen_lengths=enc.chosen_mask.sum(1), rejected_lengths=enc.rejected_mask.sum(1), **options)
    loss = loss.mean()
    grad_norm = backward_and_step(policy, optimizer, scheduler, loss, cfg.grad_clip)
    return {"loss": loss.item(), "grad_norm": grad_norm, "lr": scheduler.get_last_lr()[0],
            "chosen_logps": chosen.mean().item(), "rejected_logps": rejected.mean().item(),
            **{k: v.float().mean().item() for k, v in figures.items()}}


def train_preference(cfg: PreferenceConfig) -> StageResult:
    cfg.validate()
    started = time.perf_counter()
    threads = setup_torch(cfg.threads, cfg.seed)
    loss_fn = PREFERENCE_LOSSES.get(cfg.loss)
    task = make_task(cfg.task)
    out = Path(cfg.resume or cfg.out)
    run = open_run_dir(out, cfg, "dpo")
    tokenizer = load_tokenizer(cfg.model)
    policy = load_model(cfg.model, tokenizer, seed=cfg.seed, keep_dropout=cfg.keep_dropout)
    if cfg.data:
        pairs = file_pairs(cfg.data, tokenizer, cfg.max_length, cfg.overlong)
    else:
        pairs = embedded_pairs(task, tokenizer, cfg.pairs, cfg.seed)
    rng = random.Random(f"pref-order:{cfg.seed}")
    batches = []
    for _ in range(cfg.epochs):
        order = list(range(len(pairs)))
        rng.shuffle(order)
        batches += [encode_pairs([pairs[i] for i in order[s:s + cfg.batch_size]], tokenizer.pad_token_id)
                    for s in range(0, len(order), cfg.batch_size)]
    reference_logps = [None] * len(batches)
    if cfg.loss != "simpo":  # reference log-probs once, up front; then the reference is gone
        policy.eval()
        with torch.no_grad():
            reference_logps = [sequence_logps(policy, enc) for enc in batches]
    # the task's held-out set says nothing about a user's data
    heldout = task.heldout_problems(cfg.eval_problems) if cfg.eval_problems and not cfg.data else []
    optimizer = make_optimizer(policy, cfg.lr, cfg.weight_decay)
    scheduler = make_scheduler(optimizer, cfg.warmup_steps, len(batches), cfg.lr_schedule, cfg.min_lr_ratio)
    resumed = resume_training(cfg, out, cfg.loss, policy, optimizer, scheduler)  # after the reference log-probs
    start_step = resumed.step if resumed else 0  # the batches' order is fixed by the seed: the step is the position
    log = MetricsLog(out / "metrics.jsonl", resume_from_step=start_step if resumed else None)
    if heldout and not resumed:
        first = evaluate(policy, tokenizer, task, heldout, max_new_tokens=cfg.eval_max_new_tokens)
        log.write({"step": 0, "eval_accuracy": first.accuracy, "eval_format_accuracy": first.format_accuracy})
    options = options_for(loss_fn, {"label_smoothing": cfg.label_smoothing, "gamma": cfg.gamma})
    print(f"[{cfg.loss}] {len(pairs)} pairs x {cfg.epochs} epochs, beta={cfg.beta}, {threads} threads, run dir {out}")
    policy.train()
    per_epoch = max(len(batches) // max(cfg.epochs, 1), 1)
    with StageProgress(cfg.loss, len(batches), initial=start_step) as progress:
        for step in range(start_step + 1, len(batches) + 1):
            row = preference_step(policy, optimizer, scheduler, batches[step - 1], reference_logps[step - 1], loss_fn,
                                  cfg, options)
            row["step"] = step
            if step % cfg.log_every == 0 or step == len(batches):
                log.write(row)
            progress.update(step, loss=row["loss"], acc=row["accuracy"])
            if cfg.save_every and step % cfg.save_every == 0 and step < len(batches):
                save_checkpoint(out, step, policy, tokenizer, optimizer, scheduler, {}, {"config": asdict(cfg)},
                                cfg.keep_checkpoints)
            if step % per_epoch == 0:
                fault_point("epoch_end", step)
            fault_point("step_end", step)
    result = StageResult(name=cfg.loss, seconds=0.0, model_dir=str(out / "model"), run_dir=str(out))
    if heldout:
        final = evaluate(policy, tokenizer, task, heldout, max_new_tokens=cfg.eval_max_new_tokens)
        log.write({"step": len(batches), "eval_accuracy": final.accuracy, "eval_format_accuracy": final.format_accuracy})
        result.accuracy, result.format_accuracy = final.accuracy, final.format_accuracy
    save_model(policy, tokenizer, out / "model")
    result.seconds = time.perf_counter() - started
    result.write(out / "result.json", config=asdict(cfg), models_held={"policy": 1, "reference": 0})
    run.close()
    return result
