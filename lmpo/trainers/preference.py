"""Offline preference optimisation (DPO, cDPO, IPO, SimPO) on (prompt, chosen, rejected) pairs.

The reference model's log-probs are computed once, up front, and the reference is then
released, so only the policy stays in memory while training.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from lmpo.algos import PREFERENCE_LOSSES
from lmpo.envs import evaluate, make_task
from lmpo.models import completion_outputs, load_model, load_tokenizer, save_model
from lmpo.rollout import left_pad, right_pad
from lmpo.trainers.progress import StageProgress
from lmpo.trainers.result import StageResult
from lmpo.trainers.runtime import (MetricsLog, Schedule, grad_norm_and_clip, make_optimizer, make_scheduler,
                                   options_for, setup_torch)


@dataclass
class PreferenceConfig:
    model: str = "runs/sft/model"
    """Hugging Face model directory of the policy to start from; also the reference."""
    task: str = "sort_digits"
    """Task that supplies the embedded preference pairs and the held-out evaluation."""
    out: str = "runs/dpo"
    """Run directory: metrics.jsonl, the final model in `model/`, result.json."""
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
    eval_problems: int = 500
    """Held-out problems for greedy task accuracy at the start and the end (0 = skip)."""
    eval_max_new_tokens: int = 12
    """Token limit for evaluation answers."""
    log_every: int = 5
    """Write a metrics row every this many steps."""


@dataclass
class EncodedPairs:
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    chosen: torch.Tensor
    chosen_mask: torch.Tensor
    rejected: torch.Tensor
    rejected_mask: torch.Tensor


def encode_pairs(tokenizer, pairs) -> EncodedPairs:
    """(problem, chosen text, rejected text) pairs; each answer gets EOS appended."""
    eos = tokenizer.eos_token_id
    return encode_pair_ids([tokenizer(p.prompt, add_special_tokens=False).input_ids for p, _, _ in pairs],
                           [tokenizer(c, add_special_tokens=False).input_ids + [eos] for _, c, _ in pairs],
                           [tokenizer(r, add_special_tokens=False).input_ids + [eos] for _, _, r in pairs],
                           tokenizer.pad_token_id)


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
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = grad_norm_and_clip(policy, cfg.grad_clip)
    optimizer.step()
    scheduler.step()
    return {"loss": loss.item(), "grad_norm": grad_norm, "lr": scheduler.get_last_lr()[0],
            "chosen_logps": chosen.mean().item(), "rejected_logps": rejected.mean().item(),
            **{k: v.float().mean().item() for k, v in figures.items()}}


def train_preference(cfg: PreferenceConfig) -> StageResult:
    started = time.perf_counter()
    threads = setup_torch(cfg.threads, cfg.seed)
    loss_fn = PREFERENCE_LOSSES.get(cfg.loss)
    task = make_task(cfg.task)
    if not hasattr(task, "preference_pairs"):
        raise ValueError(f"task {cfg.task!r} has no embedded preference pairs")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(cfg.model)
    policy = load_model(cfg.model, tokenizer, seed=cfg.seed)
    pairs = task.preference_pairs(cfg.pairs, cfg.seed)
    rng = random.Random(f"pref-order:{cfg.seed}")
    batches = []
    for _ in range(cfg.epochs):
        order = list(range(len(pairs)))
        rng.shuffle(order)
        batches += [encode_pairs(tokenizer, [pairs[i] for i in order[s:s + cfg.batch_size]])
                    for s in range(0, len(order), cfg.batch_size)]
    reference_logps = [None] * len(batches)
    if cfg.loss != "simpo":  # reference log-probs once, up front; then the reference is gone
        policy.eval()
        with torch.no_grad():
            reference_logps = [sequence_logps(policy, enc) for enc in batches]
    heldout = task.heldout_problems(cfg.eval_problems) if cfg.eval_problems else []
    log = MetricsLog(out / "metrics.jsonl")
    if heldout:
        first = evaluate(policy, tokenizer, task, heldout, max_new_tokens=cfg.eval_max_new_tokens)
        log.write({"step": 0, "eval_accuracy": first.accuracy, "eval_format_accuracy": first.format_accuracy})
    optimizer = make_optimizer(policy, cfg.lr, cfg.weight_decay)
    scheduler = make_scheduler(optimizer, cfg.warmup_steps, len(batches), cfg.lr_schedule, cfg.min_lr_ratio)
    options = options_for(loss_fn, {"label_smoothing": cfg.label_smoothing, "gamma": cfg.gamma})
    print(f"[{cfg.loss}] {len(pairs)} pairs x {cfg.epochs} epochs, beta={cfg.beta}, {threads} threads, run dir {out}")
    policy.train()
    with StageProgress(cfg.loss, len(batches)) as progress:
        for step, (enc, ref) in enumerate(zip(batches, reference_logps), start=1):
            row = preference_step(policy, optimizer, scheduler, enc, ref, loss_fn, cfg, options)
            row["step"] = step
            if step % cfg.log_every == 0 or step == len(batches):
                log.write(row)
            progress.update(step, loss=row["loss"], acc=row["accuracy"])
    result = StageResult(name=cfg.loss, seconds=0.0, model_dir=str(out / "model"), run_dir=str(out))
    if heldout:
        final = evaluate(policy, tokenizer, task, heldout, max_new_tokens=cfg.eval_max_new_tokens)
        log.write({"step": len(batches), "eval_accuracy": final.accuracy, "eval_format_accuracy": final.format_accuracy})
        result.accuracy, result.format_accuracy = final.accuracy, final.format_accuracy
    save_model(policy, tokenizer, out / "model")
    result.seconds = time.perf_counter() - started
    result.write(out / "result.json", config=asdict(cfg), models_held={"policy": 1, "reference": 0})
    return result
