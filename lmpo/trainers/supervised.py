"""Continued pre-training (every token) and SFT (completion tokens only): one loop, two data
builders. Phases per step: batch → forward → loss → update.

`--resume RUN_DIR` continues from the newest complete checkpoint exactly as the uninterrupted
run would have gone on: each checkpoint holds the data order's state (CPT: the permutation
generator at the start of the current pass and the position in it; SFT: the epoch, the
position in it and the order RNG at the epoch's start)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import torch

from lmpo.algos import masked_cross_entropy
from lmpo.envs import make_task
from lmpo.rollout.evaluation import evaluate
from lmpo.rollout.agent_loop import check_rendering
from lmpo.envs.data import TokenizedExample, load_sft
from lmpo.envs.data.report import NO_LIMIT
from lmpo.models import load_tokenizer
from lmpo.trainers.batches import CPTBatches, SFTBatches, task_document_ids, task_examples
from lmpo.trainers.distributed import say
from lmpo.trainers.faults import fault_point
from lmpo.trainers.preflight import check_cpt_rows, example_limit, prompts_within_context, say_shared_prompts
from lmpo.trainers.prompts import PromptColumns
from lmpo.trainers.harness import Run, RunOptions, Updater, preflight_run
from lmpo.trainers.stopping import BestWeights, StoppingOptions, StopRule, stopping_problems
from lmpo.trainers.runtime import Schedule, make_optimizer, make_scheduler, preserved_rng
from lmpo.trainers.result import StageResult
from lmpo.trainers.validation import (at_least, checkpoint_problems, data_option_problems, no_heldout_problems,
                                      optimizer_problems, raise_if_any)


HELDOUT_SEED_OFFSET = 1_000_003  # CPT's held-out documents come from another seed of the same generator


@dataclass
class SupervisedConfig(RunOptions, PromptColumns):
    model: str = "tiny"
    """Model preset name (fresh weights) or a Hugging Face model directory to start from."""
    task: str = "sort_digits"
    """Embedded task that supplies data and the held-out evaluation, e.g. `sort_digits:length=5`."""
    out: str = "runs/supervised"
    """Run directory: metrics.jsonl, checkpoints/, the final model in `model/`, the report."""
    resume: str = ""
    """Run directory of an interrupted run to continue from its newest complete checkpoint; repeat its options."""
    seed: int = 0
    """Seed for initialisation, data order and sampling."""
    batch_size: int = 32
    """Sequences per optimizer step."""
    lr: float = 1e-3
    """Peak learning rate of AdamW."""
    warmup_steps: int = 20
    """Steps of linear learning-rate warm-up."""
    lr_schedule: Schedule = "cosine"
    """Decay after warm-up: cosine, linear or constant."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of the peak."""
    weight_decay: float = 0.01
    """AdamW weight decay (matrices only)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 = off)."""
    eval_problems: int = 500
    """Held-out problems for greedy evaluation at the end (0 = skip)."""
    eval_max_new_tokens: int = 12
    """Token limit for evaluation answers; for a multi-turn task, the budget of a whole episode (a task may set its own)."""
    log_every: int = 10
    """Write a metrics row every this many steps."""
    threads: int = 2
    """Torch CPU threads (0 = one per core)."""
    save_every: int = 50
    """Write a resumable checkpoint every this many steps (0 = only the final model)."""
    keep_checkpoints: int = 2
    """Complete checkpoints to keep."""
    data: str = ""
    """Train on this file instead of the task's data: JSONL, JSON, CSV/TSV (every value text), Parquet (the text formats also .gz/.bz2/.xz) or a saved `datasets` directory (`DIR::split`)."""
    max_length: int = 1024
    """Longest example from `data`, in tokens; the model's context where that is shorter."""
    overlong: Literal["error", "skip", "truncate"] = "error"
    """What to do with a longer example from `data`: stop with an error naming it, skip it, or truncate it."""
    eval_prompts: str = ""
    """Held-out prompts graded after training by `task` (JSONL/JSON/Parquet/CSV with `prompt` and `answer` columns, or those --prompt_field and --answer_field name, as for `lmpo train grpo --eval_prompts`; `--task exact_match` compares with the answer). Without it: the task's own held-out problems, skipped with `data` (they say nothing about a user's data)."""


@dataclass
class CPTConfig(SupervisedConfig, StoppingOptions):
    out: str = "runs/cpt"
    """Run directory: metrics.jsonl, checkpoints/, the final model in `model/`, the report."""
    steps: int = 300
    """Optimizer steps."""
    seq_len: int = 128
    """Tokens per packed training sequence."""
    corpus_documents: int = 120_000
    """Documents generated for the corpus (each is one line of the task's text)."""
    heldout_documents: int = 2000
    """Documents generated from another seed for the held-out loss that the stopping rule reads."""
    eval_loss_every: int = 25
    """Measure the held-out loss every this many steps when a stopping rule is on."""
    max_length: int = 0
    """0: documents from `data` of any length, each cut into `seq_len` rows with the rest (which must fit the model's context); N: documents over N tokens are handled as --overlong says (stop, skip, truncate)."""
    overlong: Literal["error", "skip", "truncate"] = "error"
    """With --max_length N: what to do with a longer document: stop with an error naming it, skip it, or truncate it."""

    def validate(self) -> None:
        problems = supervised_problems(self) + at_least(self, 1, "steps", "corpus_documents", "heldout_documents",
                                                        "eval_loss_every") + at_least(self, 2, "seq_len")
        if not self.max_length and self.overlong != "error":
            problems.append(f"overlong={self.overlong} acts on documents over --max_length, and CPT has none by "
                            "default (documents of any length are cut into seq_len rows); give --max_length N too")
        problems += stopping_problems(self)
        if (self.stop_patience or self.max_minutes) and self.data:
            problems.append("a stopping rule reads the held-out loss of the task's corpus; with --data it has none")
        raise_if_any("CPT", problems, self)


@dataclass
class SFTConfig(SupervisedConfig):
    out: str = "runs/sft"
    """Run directory: metrics.jsonl, checkpoints/, the final model in `model/`, the report."""
    epochs: int = 3
    """Passes over the demonstrations."""
    demonstrations: int = 300
    """Number of demonstrations drawn from the task."""
    lr: float = 3e-4
    """Peak learning rate of AdamW."""
    warmup_steps: int = 5
    """Steps of linear learning-rate warm-up."""

    def validate(self) -> None:
        raise_if_any("SFT", supervised_problems(self) + at_least(self, 1, "epochs", "demonstrations"), self)


def supervised_problems(cfg: SupervisedConfig) -> list[str]:
    problems = at_least(cfg, 1, "batch_size", "log_every", "max_nonfinite_steps")
    problems += at_least(cfg, 0 if isinstance(cfg, CPTConfig) else 1, "max_length")  # CPT: 0 = no limit
    problems += at_least(cfg, 0, "eval_problems") + optimizer_problems(cfg) + checkpoint_problems(cfg)
    problems += data_option_problems(cfg)
    if cfg.overlong not in ("error", "skip", "truncate"):
        problems.append(f"overlong={cfg.overlong!r} must be error, skip or truncate")
    return problems + no_heldout_problems(cfg)


def require_task_data(task, method: str, what: str, flag: str) -> None:
    """Refuse a stage whose task lacks the data it would train on without a file (a user's
    `exact_match` has no corpus or demonstrations of its own), before anything is written."""
    if not callable(getattr(task, method, None)):
        raise ValueError(f"task {getattr(task, 'name', type(task).__name__)!r} has no {what} of its own (no "
                         f"{method} method): give a file with {flag}")


def train_cpt(cfg: CPTConfig) -> StageResult:
    cfg.validate()
    task = make_task(cfg.task)
    if not cfg.data:
        require_task_data(task, "cpt_corpus", "CPT corpus", "--data")

    def prepare(tok):
        check_cpt_rows(cfg.model, tok, cfg.seq_len)
        if cfg.data:
            # documents of any length are cut into rows with the rest: a limit only where --max_length sets one
            examples = _load_data(cfg, tok, cfg.max_length or NO_LIMIT)
            stream = [t for e in examples for t in e.input_ids]
        else:
            stream = [t for ids in task_document_ids(task, tok, cfg.corpus_documents, cfg.seed) for t in ids]
        return CPTBatches(stream, cfg.seq_len, cfg.batch_size, cfg.steps, cfg.seed), cfg.steps

    def heldout_rows(tok) -> torch.Tensor:
        docs = task_document_ids(task, tok, cfg.heldout_documents, cfg.seed + HELDOUT_SEED_OFFSET)
        stream = [t for ids in docs for t in ids]
        if len(stream) < cfg.seq_len + 1:  # no row: the held-out loss would read 0 and the stopping rule stop
            raise ValueError(f"heldout_documents={cfg.heldout_documents}: the held-out documents hold {len(stream)} "
                             f"tokens, less than one row of seq_len + 1 = {cfg.seq_len + 1}; give more of them")
        return torch.tensor(stream[: len(stream) // (cfg.seq_len + 1) * (cfg.seq_len + 1)]).view(-1, cfg.seq_len + 1)

    stopping = StopRule.from_options(cfg, higher_is_better=False).active
    return _train(cfg, "cpt", prepare, task, heldout_rows if stopping else None)


def train_sft(cfg: SFTConfig) -> StageResult:
    cfg.validate()
    task = make_task(cfg.task)
    if not cfg.data:
        require_task_data(task, "sft_demonstrations", "SFT demonstrations", "--data")

    def prepare(tok):
        if cfg.data:
            examples = _load_data(cfg, tok, *example_limit(cfg.model, tok, cfg.max_length))
        else:
            examples = task_examples(tok, task.sft_demonstrations(cfg.demonstrations, cfg.seed), task)
        steps = cfg.epochs * -(-len(examples) // cfg.batch_size)
        return SFTBatches(examples, tok.pad_token_id, cfg.batch_size, cfg.epochs, cfg.seed), steps

    return _train(cfg, "sft", prepare, task)


def heldout_problems(cfg: SupervisedConfig, task, tokenizer) -> list:
    if cfg.eval_problems <= 0 or (cfg.data and not cfg.eval_prompts):  # a task's held-out set says nothing about a user's data
        return []
    if cfg.eval_prompts:  # exact_match grades against the answer column
        return prompts_within_context(cfg, cfg.eval_prompts, tokenizer, cfg.eval_max_new_tokens, "eval_max_new_tokens",
                                      type(cfg).__name__.removesuffix("Config"))[: cfg.eval_problems]
    return task.heldout_problems(cfg.eval_problems)


def _warn_shared_prompts(examples: list[TokenizedExample], heldout: list, tokenizer, cfg: SupervisedConfig) -> None:
    """Held-out prompts that are also the prompts of training examples, compared as the tokens
    the model reads (an example's prompt: the tokens before its first trained one)."""
    from lmpo.envs.data import chat

    trained = {tuple(e.input_ids[:e.loss_mask.index(1)]) for e in examples if 1 in e.loss_mask}
    shared = [p.prompt for p in heldout if tuple(chat.encode_start(tokenizer, p.prompt, count=False)) in trained]
    say_shared_prompts(shared, len(heldout), cfg.data, cfg.eval_prompts, "sft")


def _load_data(cfg: SupervisedConfig, tokenizer, max_length: int = 0, limit_name: str = "") -> list[TokenizedExample]:
    examples, report = load_sft(cfg.data, tokenizer, max_length=max_length or cfg.max_length, overlong=cfg.overlong,
                                limit_name=limit_name, prompt_field=cfg.prompt_field, answer_field=cfg.answer_field)
    say(f"[data] {report.summary()}")
    return examples


def _step(run: Run, model, updater: Updater, batch: tuple, step: int) -> tuple[dict, bool]:
    """forward → loss (over the global batch's tokens) → update; a non-finite loss or gradient
    skips the update (it never reaches the weights)."""
    ids, mask, attention = run.to_device(*batch)
    t0 = time.perf_counter()
    tokens = mask[:, 1:].sum().item()
    global_tokens = run.dist.all_sum(tokens)
    with run.autocast():
        logits = model(input_ids=ids, attention_mask=attention).logits
    # data parallel: each rank's share of the global token mean, times the ranks DDP averages over
    loss = masked_cross_entropy(logits[:, :-1].float(), ids[:, 1:], mask[:, 1:],
                                num_tokens=global_tokens / run.dist.world)
    lr = updater.lr  # the rate this step uses
    updated, grad_norm = updater.step(loss)
    row = {"step": step, "loss": run.dist.all_sum(loss.item()) / run.dist.world, "lr": lr,
           "grad_norm": grad_norm, "tokens_per_s": global_tokens / (time.perf_counter() - t0)}
    return row, updated


@torch.no_grad()
def heldout_loss(run: Run, model, rows: torch.Tensor, batch_size: int) -> float:
    """Mean token cross-entropy on held-out packed rows, in eval mode."""
    was_training = model.training
    model.eval()
    total = count = 0.0
    for start in range(0, len(rows), batch_size):
        ids = run.to_device(rows[start:start + batch_size])
        with run.autocast():
            logits = model(input_ids=ids).logits
        n = ids[:, 1:].numel()
        total += masked_cross_entropy(logits[:, :-1].float(), ids[:, 1:], torch.ones_like(ids[:, 1:]).float()).item() * n
        count += n
    model.train(was_training)
    return total / max(count, 1)


def _first_eval(model, run: Run, tokenizer, task, heldout: list, cfg: SupervisedConfig) -> None:
    """The held-out evaluation before training (step 0), leaving the random state as it found it:
    it must not move dropout's draws, or the trained model would differ from a run without it."""
    with preserved_rng():
        ev = evaluate(run.plain(model), tokenizer, task, heldout, max_new_tokens=cfg.eval_max_new_tokens,
                      budget_option="--eval_max_new_tokens")
    run.write({"step": 0, **ev.metrics()})
    model.train()


def _train(cfg: SupervisedConfig, name: str, prepare, task, stopping=None) -> StageResult:
    """`stopping`: the held-out rows' builder, for a stage that stops on its held-out loss."""
    preflight_run(cfg, name)
    tokenizer = load_tokenizer(cfg.model, cfg.trust_remote_code, cfg.chat_template, cfg.chat_template_kwargs)
    # the data before the run directory: a bad file says so before anything is written or loaded
    batches, total_steps = prepare(tokenizer)
    heldout = heldout_problems(cfg, task, tokenizer)
    if name == "sft" and cfg.data and cfg.eval_prompts:
        _warn_shared_prompts(batches.examples, heldout, tokenizer, cfg)
    rows = stopping(tokenizer) if stopping else None
    run = Run(cfg, name)
    model = run.load_policy(tokenizer)
    if heldout and run.dist.is_main:  # the evaluation after training renders episodes: refuse a template now
        check_rendering(task, run.plain(model), tokenizer)
    model.train()
    # the rule's wall-time cap counts from here, not from before the data was read
    stop = StopRule.from_options(cfg, higher_is_better=False) if stopping else None
    best = BestWeights(run.out / "best")
    optimizer = make_optimizer(model, cfg.lr, cfg.weight_decay)
    scheduler = make_scheduler(optimizer, cfg.warmup_steps, total_steps, cfg.lr_schedule, cfg.min_lr_ratio)
    updater = Updater(optimizer, scheduler, cfg.grad_clip, cfg.max_nonfinite_steps, name)
    resumed = run.resume(model, optimizer, scheduler)
    start_step = 0
    if resumed is not None:
        batches.load_state_dict(resumed.data)
        start_step = resumed.step
        updater.load_state(resumed.state)
        if stop is not None:
            stop.load_state(resumed.state.get("stopping", {}))
    if name == "sft" and heldout and resumed is None and run.dist.is_main:  # the starting point of the curves
        _first_eval(model, run, tokenizer, task, heldout, cfg)
    trained = run.trained(model)
    run.say(f"{cfg.model}: {run.describe(model)}, {total_steps} steps")
    last = start_step
    with run.progress(total_steps, initial=start_step) as progress:
        for step, batch in enumerate(batches, start=start_step + 1):
            last = step
            row, updated = _step(run, trained, updater, run.dist.shard_batch(batch), step)
            if not updated:
                row["skipped_updates"] = updater.skipped
                if updater.streak >= cfg.max_nonfinite_steps:
                    run.write(row)
                    updater.check(step)
            reason = None
            if stop is not None and (step % cfg.eval_loss_every == 0 or step == total_steps):
                row["eval_loss"] = heldout_loss(run, model, rows, cfg.batch_size)
                if stop.observe(step, row["eval_loss"]) and run.dist.is_main:
                    best.keep(run.plain(model), tokenizer)
                reason = run.dist.broadcast(stop.reason())
            if step % cfg.log_every == 0 or step == total_steps or "skipped_updates" in row or "eval_loss" in row:
                run.write(row)
            progress.update(step, loss=row["loss"])
            if reason:
                run.say(f"stopping at step {step}: {reason}; keeping the model of step {stop.best_step}")
                run.write({"step": step, "stopped": reason, "best_step": stop.best_step})
                break
            if run.checkpoint_due(step, total_steps):
                state = {**updater.state(), **({"stopping": stop.state()} if stop else {})}
                run.checkpoint(step, model, tokenizer, optimizer, scheduler, state=state,
                               data_state=batches.state_dict())
            if batches.at_epoch_end:
                fault_point("epoch_end", step)
            fault_point("step_end", step)
    result = StageResult(name=name, seconds=0.0, model_dir="", run_dir=str(run.out))
    run.dist.barrier()
    if stop is not None and best.restore(model):  # the next stage starts from the best model
        run.say(f"the model of step {stop.best_step} (held-out loss {stop.best:.4f}) is the stage's model")
    run.sync(model)
    if heldout and run.dist.is_main:
        ev = evaluate(run.plain(model), tokenizer, task, heldout, max_new_tokens=cfg.eval_max_new_tokens,
                      budget_option="--eval_max_new_tokens")
        result.accuracy, result.format_accuracy = ev.accuracy, ev.format_accuracy
        result.tool_call_rate, result.terminations = ev.tool_call_rate, ev.terminations
        result.breakdown = ev.breakdown or None
        run.write({"step": last, **ev.metrics()})
    return run.finish(model, tokenizer, result, **({"best_step": stop.best_step} if stop is not None else {}))
