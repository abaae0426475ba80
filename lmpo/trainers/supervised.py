"""Continued pre-training (every token) and SFT (completion tokens only): one loop, two data
builders. Phases per step: batch → forward → loss → update."""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Literal

import torch

from lmpo.algos import masked_cross_entropy
from lmpo.envs import Problem, evaluate, make_task
from lmpo.envs.data import TokenizedExample, load_sft
from lmpo.models import count_parameters, load_model_and_tokenizer, save_model
from lmpo.rollout import right_pad
from lmpo.trainers.progress import StageProgress
from lmpo.trainers.runtime import (MetricsLog, Schedule, grad_norm_and_clip, make_optimizer, make_scheduler,
                                   setup_torch)
from lmpo.trainers.result import StageResult


@dataclass
class SupervisedConfig:
    model: str = "tiny"
    """Model preset name (fresh weights) or a Hugging Face model directory to start from."""
    task: str = "sort_digits"
    """Embedded task that supplies data and the held-out evaluation, e.g. `sort_digits:length=5`."""
    out: str = "runs/supervised"
    """Run directory: metrics.jsonl, the final model in `model/`, the report."""
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
    """Token limit for evaluation answers."""
    log_every: int = 10
    """Write a metrics row every this many steps."""
    threads: int = 2
    """Torch CPU threads (0 = one per core)."""
    max_nonfinite_steps: int = 3
    """Stop with an error after this many consecutive steps with a non-finite loss or gradient (each is skipped)."""
    data: str = ""
    """Train on this file instead of the task's data: JSONL, Parquet, or a saved `datasets` directory (`DIR::split`)."""
    max_length: int = 1024
    """Longest example from `data`, in tokens."""
    overlong: Literal["error", "skip", "truncate"] = "error"
    """What to do with a longer example from `data`: stop with an error naming it, skip it, or truncate it."""


@dataclass
class CPTConfig(SupervisedConfig):
    out: str = "runs/cpt"
    """Run directory: metrics.jsonl, the final model in `model/`, the report."""
    steps: int = 300
    """Optimizer steps."""
    seq_len: int = 128
    """Tokens per packed training sequence."""
    corpus_documents: int = 120_000
    """Documents generated for the corpus (each is one line of the task's text)."""


@dataclass
class SFTConfig(SupervisedConfig):
    out: str = "runs/sft"
    """Run directory: metrics.jsonl, the final model in `model/`, the report."""
    epochs: int = 3
    """Passes over the demonstrations."""
    demonstrations: int = 300
    """Number of demonstrations drawn from the task."""
    lr: float = 3e-4
    """Peak learning rate of AdamW."""
    warmup_steps: int = 5
    """Steps of linear learning-rate warm-up."""


def cpt_batches(stream: list[int], seq_len: int, batch_size: int, steps: int,
                seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, None]]:
    """Cut a token stream (documents each ending with EOS) into rows of `seq_len + 1` tokens,
    shuffled each pass; loss on every token."""
    rows = torch.tensor(stream[: len(stream) // (seq_len + 1) * (seq_len + 1)]).view(-1, seq_len + 1)
    if len(rows) < batch_size:
        raise ValueError(f"the corpus packs into {len(rows)} rows of {seq_len + 1} tokens, fewer than one batch of {batch_size}")
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(rows), generator=gen)
    position = 0
    for _ in range(steps):
        if position + batch_size > len(order):
            order, position = torch.randperm(len(rows), generator=gen), 0
        batch = rows[order[position:position + batch_size]]
        position += batch_size
        yield batch, torch.ones_like(batch, dtype=torch.float32), None


def task_examples(tokenizer, problems: list[Problem]) -> list[TokenizedExample]:
    """Prompt (no loss) + answer + EOS (loss), in the task's own layout."""
    examples = []
    for p in problems:
        prompt = tokenizer(p.prompt, add_special_tokens=False).input_ids
        answer = tokenizer(p.answer, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        examples.append(TokenizedExample(prompt + answer, [0] * len(prompt) + [1] * len(answer)))
    return examples


def sft_batches(examples: list[TokenizedExample], pad_id: int, batch_size: int, epochs: int,
                seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Right-padded batches in a fresh shuffled order each epoch: ids, loss mask, attention mask."""
    rng = random.Random(f"sft-order:{seed}")
    for _ in range(epochs):
        order = list(range(len(examples)))
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            chunk = [examples[i] for i in order[start:start + batch_size]]
            ids, attention = right_pad([e.input_ids for e in chunk], pad_id)
            loss_mask, _ = right_pad([e.loss_mask for e in chunk], 0.0, dtype=torch.float32)
            yield ids, loss_mask, attention


def train_cpt(cfg: CPTConfig) -> StageResult:
    task = make_task(cfg.task)

    def prepare(tok):
        if cfg.data:
            examples = _load_data(cfg, tok)
            stream = [t for e in examples for t in e.input_ids]
        else:
            stream = []
            for ids in tok(task.cpt_corpus(cfg.corpus_documents, cfg.seed), add_special_tokens=False).input_ids:
                stream.extend([*ids, tok.eos_token_id])
        return cpt_batches(stream, cfg.seq_len, cfg.batch_size, cfg.steps, cfg.seed), cfg.steps

    return _train(cfg, "cpt", prepare, task)


def train_sft(cfg: SFTConfig) -> StageResult:
    task = make_task(cfg.task)

    def prepare(tok):
        if cfg.data:
            examples = _load_data(cfg, tok)
        else:
            examples = task_examples(tok, task.sft_demonstrations(cfg.demonstrations, cfg.seed))
        steps = cfg.epochs * -(-len(examples) // cfg.batch_size)
        return sft_batches(examples, tok.pad_token_id, cfg.batch_size, cfg.epochs, cfg.seed), steps

    return _train(cfg, "sft", prepare, task)


def _load_data(cfg: SupervisedConfig, tokenizer) -> list[TokenizedExample]:
    examples, report = load_sft(cfg.data, tokenizer, max_length=cfg.max_length, overlong=cfg.overlong)
    print(f"[data] {report.summary()}")
    return examples


def _train(cfg: SupervisedConfig, name: str, prepare, task) -> StageResult:
    started = time.perf_counter()
    threads = setup_torch(cfg.threads, cfg.seed)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer = load_model_and_tokenizer(cfg.model, seed=cfg.seed)
    model.train()
    batches, total_steps = prepare(tokenizer)
    optimizer = make_optimizer(model, cfg.lr, cfg.weight_decay)
    scheduler = make_scheduler(optimizer, cfg.warmup_steps, total_steps, cfg.lr_schedule, cfg.min_lr_ratio)
    log = MetricsLog(out / "metrics.jsonl")
    print(f"[{name}] {cfg.model}: {count_parameters(model) / 1e6:.2f}M parameters, {threads} threads, "
          f"{total_steps} steps, run dir {out}")
    skipped = streak = 0
    with StageProgress(name, total_steps) as progress:
        for step, (ids, mask, attention) in enumerate(batches, start=1):
            t0 = time.perf_counter()
            logits = model(input_ids=ids, attention_mask=attention).logits
            loss = masked_cross_entropy(logits[:, :-1], ids[:, 1:], mask[:, 1:])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = grad_norm_and_clip(model, cfg.grad_clip)
            row = {"step": step, "loss": loss.item(), "lr": scheduler.get_last_lr()[0], "grad_norm": grad_norm,
                   "tokens_per_s": mask[:, 1:].sum().item() / (time.perf_counter() - t0)}
            if math.isfinite(row["loss"]) and math.isfinite(grad_norm):
                optimizer.step()
                scheduler.step()
                streak = 0
            else:  # never let a non-finite update reach the weights
                optimizer.zero_grad(set_to_none=True)
                skipped, streak = skipped + 1, streak + 1
                row["skipped_updates"] = skipped
                log.write(row)
                if streak >= cfg.max_nonfinite_steps:
                    raise RuntimeError(f"[{name}] step {step}: the loss or gradients were not finite in {streak} "
                                       f"consecutive steps (each was skipped); see {out / 'metrics.jsonl'}")
                continue
            if step % cfg.log_every == 0 or step == total_steps:
                log.write(row)
            progress.update(step, loss=row["loss"])
    save_model(model, tokenizer, out / "model")
    result = StageResult(name=name, seconds=0.0, model_dir=str(out / "model"), run_dir=str(out))
    if cfg.eval_problems > 0 and not cfg.data:  # the task's held-out set says nothing about a user's data
        ev = evaluate(model, tokenizer, task, task.heldout_problems(cfg.eval_problems),
                      max_new_tokens=cfg.eval_max_new_tokens)
        result.accuracy, result.format_accuracy = ev.accuracy, ev.format_accuracy
        log.write({"step": total_steps, "eval_accuracy": ev.accuracy, "eval_format_accuracy": ev.format_accuracy})
    result.seconds = time.perf_counter() - started
    result.write(out / "result.json", config=asdict(cfg))
    return result
