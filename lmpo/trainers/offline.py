"""What the offline preference trainers (the DPO family, ORPO, KTO) share: their common options,
fixed batches in a seeded order, and the step loop with its held-out evaluation, checkpoints
and resume.

Each trainer loads its data and computes what its loss needs up front (the reference's
log-probs), then hands `train_offline` its batches and one function that makes an optimizer step
of batch i. The batches' order is fixed by the seed, so a resumed run continues at the step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Literal, Sequence, TypeVar

import torch

from lmpo.rollout.evaluation import evaluate
from lmpo.trainers.distributed import equal_split_refusal
from lmpo.trainers.faults import fault_point
from lmpo.trainers.harness import Run, RunOptions, Updater
from lmpo.trainers.reference_pass import stoppable_reference_pass
from lmpo.trainers.result import StageResult
from lmpo.trainers.resume_changes import CAP_STOP, cap_record, stops_at_once
from lmpo.trainers.runtime import Schedule, make_optimizer, make_scheduler
from lmpo.trainers.validation import (at_least, checkpoint_problems, data_option_problems, no_heldout_problems,
                                      optimizer_problems)

T = TypeVar("T")
SHOWN = {"accuracy": "acc", "kl": "kl"}  # figures the progress line shows beside the loss, when a loss has them
StepFn = Callable[[torch.nn.Module, Updater, int], dict]
"""(the module losses run through, the updater, the 0-based batch index) -> the step's figures."""


@dataclass
class OfflineConfig(RunOptions):
    model: str = "runs/sft/model"
    """Hugging Face model directory of the policy to start from; also the reference."""
    task: str = "sort_digits"
    """Task that supplies the embedded preference data and the held-out evaluation."""
    out: str = "runs/dpo"
    """Run directory: metrics.jsonl, checkpoints/, the final model in `model/`, result.json."""
    resume: str = ""
    """Run directory of an interrupted run to continue from its newest complete checkpoint; repeat its options."""
    seed: int = 0
    """Seed for the data and its order."""
    threads: int = 2
    """Torch CPU threads (0 = one per core)."""
    pairs: int = 2000
    """Training pairs drawn from the task's training split."""
    epochs: int = 1
    """Passes over the data."""
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
    """Token limit for evaluation answers; for a multi-turn task, the budget of a whole episode (a task may set its own)."""
    log_every: int = 5
    """Write a metrics row every this many steps."""
    save_every: int = 50
    """Write a resumable checkpoint every this many steps (0 = only the final model)."""
    keep_checkpoints: int = 2
    """Complete checkpoints to keep."""
    data: str = ""
    """Train on the pairs of this file instead of the task's: JSONL, JSON, CSV/TSV (every value text), Parquet (the text formats also .gz/.bz2/.xz) or a saved `datasets` directory (`DIR::split`) with `prompt`, `chosen`, `rejected` (strings, or message lists rendered with the chat template)."""
    max_length: int = 1024
    """Longest pair from `data` (prompt + longer reply), in tokens; the model's context where that is shorter."""
    overlong: Literal["error", "skip", "truncate"] = "error"
    """What to do with a longer pair from `data`: stop with an error naming it, skip it, or truncate the replies."""
    max_minutes: float = 0.0
    """Wall-time cap in minutes: stop after the first step past it and evaluate that model (0 = none); a resumed run counts the time it trained before."""


def offline_problems(cfg: OfflineConfig) -> list[str]:
    """The shared options' problems, and `beta` (every offline loss has one); each trainer adds its loss's."""
    problems = at_least(cfg, 1, "batch_size", "epochs", "pairs", "log_every", "max_length")
    problems += at_least(cfg, 0, "eval_problems", "max_minutes") + optimizer_problems(cfg) + checkpoint_problems(cfg)
    if not cfg.beta > 0:
        problems.append(f"beta={cfg.beta} must be > 0")
    return problems + data_option_problems(cfg) + no_heldout_problems(cfg)


def ordered_batches(run: Run, cfg: OfflineConfig, items: Sequence[T], encode: Callable[[list], object],
                    what: str, whole: Callable[[list[T]], list] = list) -> list:
    """`cfg.epochs` seeded passes over `items` in batches of `cfg.batch_size`; every process orders
    them alike, applies `whole` to the whole batch and keeps its share of the result; `encode`
    makes a batch of tensors (a dataclass whose fields are tensors), moved to the run's device."""
    if refusal := equal_split_refusal(len(items), cfg.batch_size, run.dist.world, what):
        raise ValueError(refusal)  # the figures are means over equal shares
    rng = random.Random(f"pref-order:{cfg.seed}")
    batches = []
    for _ in range(cfg.epochs):
        order = list(range(len(items)))
        rng.shuffle(order)
        batches += [encode(run.dist.shard(whole([items[i] for i in order[s:s + cfg.batch_size]]), what))
                    for s in range(0, len(order), cfg.batch_size)]
    return [type(enc)(*run.to_device(*vars(enc).values())) for enc in batches]


@torch.no_grad()
def reference_logps(run: Run, policy, batches: list, score: Callable) -> list:
    """`score(model, batch)` of every batch by the reference: the starting policy (with LoRA: the
    base, adapter disabled — the same numbers, since a fresh adapter adds nothing). Computed once,
    before `train_offline` resumes or updates the policy, so no reference model stays in memory.
    Under FSDP it is the unsharded copy that scores: a forward of the sharded policy leaves its
    root group's weights gathered, and the optimizer made after it held those instead of the
    shards (wrong gradients, and a KeyError at the first checkpoint)."""
    model = run.plain(policy)
    model.eval()
    # one forward per batch before the first step: on a large file, minutes to show progress for, and
    # to stop in (the cap, SIGTERM, Ctrl-C) with what was done kept for `--resume`
    with run.autocast():
        out = stoppable_reference_pass(run, model, batches, score)
    policy.train()
    return out


def train_offline(run: Run, cfg: OfflineConfig, policy, tokenizer, task, batches: list, step_fn: StepFn,
                  label: str, summary: str, data: DataSize) -> StageResult:
    """Held-out accuracy at the start, one `step_fn` per batch (metrics, progress, checkpoints,
    the non-finite guard, resume at the step, the wall-time cap), held-out accuracy at the end;
    the final model. `data` says how much was trained on, for `result.json` (`lmpo compare`
    counts it against a sample budget)."""
    # the task's held-out set says nothing about a user's data
    heldout = task.heldout_problems(cfg.eval_problems) if cfg.eval_problems and not cfg.data and run.dist.is_main else []
    optimizer = make_optimizer(policy, cfg.lr, cfg.weight_decay)
    scheduler = make_scheduler(optimizer, cfg.warmup_steps, len(batches), cfg.lr_schedule, cfg.min_lr_ratio)
    updater = Updater(optimizer, scheduler, cfg.grad_clip, cfg.max_nonfinite_steps, label)
    resumed = run.resume(policy, optimizer, scheduler)
    start_step = resumed.step if resumed else 0  # the batches' order is fixed by the seed: the step is the position
    if resumed:
        updater.load_state(resumed.state)
    if heldout and not resumed:
        first = evaluate(run.plain(policy), tokenizer, task, heldout, max_new_tokens=cfg.eval_max_new_tokens,
                         budget_option="--eval_max_new_tokens")
        run.write({"step": 0, "eval_accuracy": first.accuracy, "eval_format_accuracy": first.format_accuracy,
                   "elapsed_s": run.elapsed()})
    run.say(f"{summary}; {run.describe(policy)}")
    policy.train()
    trained = run.trained(policy)
    per_epoch = max(len(batches) // max(cfg.epochs, 1), 1)
    last_step = start_step
    at_once = stops_at_once(run, resumed, cfg.max_minutes)  # killed after its stop at the cap: it ends there
    with run.progress(len(batches), initial=start_step, label=label) as progress:
        for step in range(start_step + 1, len(batches) + 1) if not at_once else ():
            last_step = step
            row = step_fn(trained, updater, step - 1)
            row["step"] = step
            if updater.streak:
                row["skipped_updates"] = updater.skipped
            out_of_time = run.out_of_time(cfg.max_minutes) and step < len(batches)
            if step % cfg.log_every == 0 or step == len(batches) or updater.streak or out_of_time:
                run.write(row)
            updater.check(step)
            progress.update(step, loss=row["loss"], **{short: row[k] for k, short in SHOWN.items() if k in row})
            # capped: it finishes (SIGTERM too), with a checkpoint there that `--resume --max_minutes` goes on from
            if run.checkpoint_due(step, len(batches)) or (out_of_time and cfg.save_every):
                run.checkpoint(step, policy, tokenizer, optimizer, scheduler, stopping=out_of_time,
                               state={**updater.state(), **({CAP_STOP: True} if out_of_time else {})})
            if step % per_epoch == 0:
                fault_point("epoch_end", step)
            fault_point("step_end", step)
            if out_of_time:
                _say_stop(run, cfg, step, len(batches))
                break
    if at_once:
        _say_stop(run, cfg, start_step, len(batches))
    result = StageResult(name=label, seconds=0.0, model_dir="", run_dir=str(run.out))
    run.sync(policy)
    if heldout:
        final = evaluate(run.plain(policy), tokenizer, task, heldout, max_new_tokens=cfg.eval_max_new_tokens,
                         budget_option="--eval_max_new_tokens")
        run.write({"step": last_step, "eval_accuracy": final.accuracy, "eval_format_accuracy": final.format_accuracy,
                   "elapsed_s": run.elapsed()})
        result.accuracy, result.format_accuracy = final.accuracy, final.format_accuracy
    trained_items = min(data.items, last_step * cfg.batch_size)  # a second epoch is not new data
    capped = cap_record(last_step, len(batches), cfg.max_minutes, bool(cfg.save_every)) if last_step < len(batches) else {}
    return run.finish(policy, tokenizer, result, models_held={"policy": 1, "reference": 0},
                      pairs_trained=trained_items, completion_tokens=round(data.tokens_per_item * trained_items),
                      **capped)


def _say_stop(run: Run, cfg: OfflineConfig, step: int, steps: int) -> None:
    reason = f"the wall-time cap of {cfg.max_minutes:g} minutes"
    goes_on = f"; --resume {run.out} with a larger --max_minutes (or 0) trains the remaining steps" if cfg.save_every else ""
    run.say(f"stopping at step {step} of {steps}: {reason}{goes_on}")
    run.write({"step": step, "stopped": reason})


@dataclass
class DataSize:
    """How much an offline trainer's data holds: items (pairs, or unpaired examples) and the mean
    completion tokens of one item (both completions of a pair)."""

    items: int
    tokens_per_item: float

    @classmethod
    def of(cls, items: Sequence, tokens: Callable[[object], int]) -> "DataSize":
        return cls(len(items), sum(map(tokens, items)) / max(len(items), 1))


def mean_over_processes(run: Run, figures: dict[str, torch.Tensor]) -> dict[str, float]:
    """Each figure's mean over the data-parallel processes (equal shares of a batch)."""
    return {k: run.dist.all_sum(v.item()) / run.dist.world for k, v in figures.items()}
