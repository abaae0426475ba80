"""Offline preference optimisation (DPO, cDPO, IPO, SimPO) on (prompt, chosen, rejected) pairs.

The reference model's log-probs are computed once, up front, and the reference is then
released, so only the policy stays in memory while training.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

import torch

from lmpo.algos import PREFERENCE_LOSSES
from lmpo.algos.preference_mix import is_mix
from lmpo.envs import make_task
from lmpo.rollout.evaluation import evaluate
from lmpo.envs.data import PreferencePair
from lmpo.models import completion_outputs, load_tokenizer
from lmpo.rollout import left_pad, right_pad
from lmpo.trainers.faults import fault_point
from lmpo.trainers.harness import Run, RunOptions, Updater
from lmpo.trainers.pairs import embedded_pairs, file_pairs
from lmpo.trainers.result import StageResult
from lmpo.trainers.validation import (at_least, checkpoint_problems, data_option_problems, optimizer_problems,
                                     preference_option_problems, raise_if_any)
from lmpo.trainers.runtime import Schedule, make_optimizer, make_scheduler, options_for


@dataclass
class PreferenceConfig(RunOptions):
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
    """Preference loss: dpo, cdpo, ipo, simpo (reference-free), robust, hinge, exo_pair, nca_pair, bco_pair, sppo_hard, aot, aot_pair, apo_zero, apo_down, discopop, sft (NLL of the chosen answer); or a weighted sum of them, `name=weight,...` (e.g. MPO's `dpo=0.8,bco_pair=0.2,sft=1`), every part on the same batch."""
    beta: float = 0.1
    """Strength of the implicit KL to the reference (DPO's beta)."""
    label_smoothing: float = 0.1
    """cdpo, robust: assumed probability that a pair's label is flipped; exo_pair: the smoothed label's eps (> 0; TRL's 1e-3); aot, aot_pair: label smoothing of their logistic loss (TRL's default 0)."""
    gamma: float = 0.5
    """simpo: target reward margin (in reward units, after beta)."""
    discopop_tau: float = 0.05
    """discopop: temperature of the switch between its logistic and exponential parts."""
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
    max_minutes: float = 0.0
    """Wall-time cap in minutes: stop after the first step (online DPO: round) past it and evaluate that model (0 = none)."""

    def validate(self) -> None:
        raise_if_any("preference", preference_problems(self))


def preference_problems(cfg: PreferenceConfig) -> list[str]:
    problems = at_least(cfg, 1, "batch_size", "epochs", "pairs", "log_every", "max_length")
    problems += at_least(cfg, 0, "eval_problems", "max_minutes") + optimizer_problems(cfg) + checkpoint_problems(cfg)
    if is_mix(cfg.loss):
        try:  # a weighted sum: say which part is wrong
            PREFERENCE_LOSSES.get(cfg.loss)
        except ValueError as err:
            problems.append(str(err))
    elif cfg.loss not in PREFERENCE_LOSSES:
        problems.append(f"loss={cfg.loss!r} is not one of {PREFERENCE_LOSSES.names()}")
    if not cfg.beta > 0:
        problems.append(f"beta={cfg.beta} must be > 0")
    if not 0 <= cfg.label_smoothing < 0.5:
        problems.append(f"label_smoothing={cfg.label_smoothing} must be in [0, 0.5)")
    return problems + preference_option_problems(cfg) + data_option_problems(cfg)


def preference_options(cfg: PreferenceConfig) -> dict:
    """The loss options of the config by name; `options_for` passes each loss those it reads
    (`validation.PREFERENCE_OPTIONS` lists them)."""
    return {"label_smoothing": cfg.label_smoothing, "gamma": cfg.gamma, "discopop_tau": cfg.discopop_tau}


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


def preference_step(run: Run, policy, updater: Updater, enc: EncodedPairs, ref, loss_fn, cfg, options: dict) -> dict:
    """One optimizer step of a preference loss on this process's share of a batch of pairs
    (equal shares: the mean over processes is the global mean); returns its figures."""
    with run.autocast():
        chosen, rejected = sequence_logps(policy, enc)
    ref_chosen, ref_rejected = ref if ref is not None else (None, None)
    loss, figures = loss_fn(chosen, rejected, ref_chosen, ref_rejected, beta=cfg.beta,
                            chosen_lengths=enc.chosen_mask.sum(1), rejected_lengths=enc.rejected_mask.sum(1), **options)
    loss = loss.mean()
    _, grad_norm = updater.step(loss)
    figures = {"loss": loss.detach(), "chosen_logps": chosen.detach().mean(), "rejected_logps": rejected.detach().mean(),
               **{k: v.detach().float().mean() for k, v in figures.items()}}
    return {"grad_norm": grad_norm, "lr": updater.lr,
            **{k: run.dist.all_sum(v.item()) / run.dist.world for k, v in figures.items()}}


def train_preference(cfg: PreferenceConfig) -> StageResult:
    cfg.validate()
    loss_fn = PREFERENCE_LOSSES.get(cfg.loss)
    task = make_task(cfg.task)
    run = Run(cfg, "dpo")
    tokenizer = load_tokenizer(cfg.model)
    policy = run.load_policy(tokenizer, keep_dropout=cfg.keep_dropout)
    if cfg.data:
        pairs = file_pairs(cfg.data, tokenizer, cfg.max_length, cfg.overlong)
    else:
        pairs = embedded_pairs(task, tokenizer, cfg.pairs, cfg.seed)
    rng = random.Random(f"pref-order:{cfg.seed}")
    batches = []
    for _ in range(cfg.epochs):
        order = list(range(len(pairs)))
        rng.shuffle(order)
        # every process orders the pairs alike and keeps its share of each batch
        batches += [encode_pairs(run.dist.shard([pairs[i] for i in order[s:s + cfg.batch_size]], "pairs"),
                                 tokenizer.pad_token_id)
                    for s in range(0, len(order), cfg.batch_size)]
    batches = [EncodedPairs(*run.to_device(*vars(enc).values())) for enc in batches]
    reference_logps = [None] * len(batches)
    if not getattr(loss_fn, "reference_free", False):  # reference log-probs once, up front; then it is gone
        reference_logps = reference_sequence_logps(run, policy, batches)
    # the task's held-out set says nothing about a user's data
    heldout = task.heldout_problems(cfg.eval_problems) if cfg.eval_problems and not cfg.data and run.dist.is_main else []
    optimizer = make_optimizer(policy, cfg.lr, cfg.weight_decay)
    scheduler = make_scheduler(optimizer, cfg.warmup_steps, len(batches), cfg.lr_schedule, cfg.min_lr_ratio)
    updater = Updater(optimizer, scheduler, cfg.grad_clip, cfg.max_nonfinite_steps, cfg.loss)
    resumed = run.resume(policy, optimizer, scheduler)  # after the reference log-probs
    start_step = resumed.step if resumed else 0  # the batches' order is fixed by the seed: the step is the position
    if resumed:
        updater.load_state(resumed.state)
    if heldout and not resumed:
        first = evaluate(run.plain(policy), tokenizer, task, heldout, max_new_tokens=cfg.eval_max_new_tokens)
        run.write({"step": 0, "eval_accuracy": first.accuracy, "eval_format_accuracy": first.format_accuracy,
                   "elapsed_s": run.elapsed()})
    options = options_for(loss_fn, preference_options(cfg))
    run.say(f"{len(pairs)} pairs x {cfg.epochs} epochs, {cfg.loss}, beta={cfg.beta}; {run.describe(policy)}")
    policy.train()
    trained = run.trained(policy)
    per_epoch = max(len(batches) // max(cfg.epochs, 1), 1)
    last_step = start_step
    with run.progress(len(batches), initial=start_step, label=cfg.loss) as progress:
        for step in range(start_step + 1, len(batches) + 1):
            last_step = step
            row = preference_step(run, trained, updater, batches[step - 1], reference_logps[step - 1], loss_fn,
                                  cfg, options)
            row["step"] = step
            if updater.streak:
                row["skipped_updates"] = updater.skipped
            out_of_time = run.out_of_time(cfg.max_minutes)
            if step % cfg.log_every == 0 or step == len(batches) or updater.streak or out_of_time:
                run.write(row)
            updater.check(step)
            progress.update(step, loss=row["loss"], acc=row.get("accuracy", 0.0))
            if cfg.save_every and step % cfg.save_every == 0 and step < len(batches):
                run.checkpoint(step, policy, tokenizer, optimizer, scheduler, state=updater.state())
            if step % per_epoch == 0:
                fault_point("epoch_end", step)
            fault_point("step_end", step)
            if out_of_time and step < len(batches):
                reason = f"the wall-time cap of {cfg.max_minutes:g} minutes"
                run.say(f"stopping at step {step} of {len(batches)}: {reason}")
                run.write({"step": step, "stopped": reason})
                break
    result = StageResult(name=cfg.loss, seconds=0.0, model_dir="", run_dir=str(run.out))
    run.sync(policy)
    if heldout:
        final = evaluate(run.plain(policy), tokenizer, task, heldout, max_new_tokens=cfg.eval_max_new_tokens)
        run.write({"step": last_step, "eval_accuracy": final.accuracy, "eval_format_accuracy": final.format_accuracy,
                   "elapsed_s": run.elapsed()})
        result.accuracy, result.format_accuracy = final.accuracy, final.format_accuracy
    held = {"policy": 1, "reference": 0}
    # what `lmpo compare` counts against a sample budget: the pairs trained on and their completions' tokens
    trained_pairs = min(len(pairs), last_step * cfg.batch_size)
    tokens_per_pair = sum(len(p.chosen_ids) + len(p.rejected_ids) for p in pairs) / max(len(pairs), 1)
    return run.finish(policy, tokenizer, result, models_held=held, pairs_trained=trained_pairs,
                      completion_tokens=round(tokens_per_pair * trained_pairs))


@torch.no_grad()
def reference_sequence_logps(run: Run, policy, batches: list[EncodedPairs]) -> list[tuple]:
    """The reference's log-probs of every batch, from the starting policy (with LoRA: the base,
    adapter disabled — the same numbers, since a fresh adapter adds nothing)."""
    policy.eval()
    with run.autocast():
        out = [sequence_logps(policy, enc) for enc in batches]
    policy.train()
    return out
