"""Continued pre-training (every token) and SFT (completion tokens only): one loop, two data
builders. Phases per step: batch → forward → loss → update."""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import torch

from lmpo.algos import masked_cross_entropy
from lmpo.envs import Problem, evaluate, make_task
from lmpo.models import count_parameters, load_model_and_tokenizer, save_model
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


def cpt_batches(tokenizer, documents: list[str], seq_len: int, batch_size: int, steps: int,
                seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Pack documents, separated by EOS, into rows of `seq_len + 1` tokens; loss on every token."""
    eos = tokenizer.eos_token_id
    stream: list[int] = []
    for ids in tokenizer(documents, add_special_tokens=False).input_ids:
        stream.extend(ids)
        stream.append(eos)
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
        yield batch, torch.ones_like(batch, dtype=torch.float32)


def sft_batches(tokenizer, problems: list[Problem], batch_size: int, epochs: int,
                seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Prompt + answer + EOS, right-padded; the mask marks the answer and EOS tokens only."""
    examples = []
    for p in problems:
        prompt = tokenizer(p.prompt, add_special_tokens=False).input_ids
        answer = tokenizer(p.answer, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        examples.append((prompt, answer))
    rng = random.Random(f"sft-order:{seed}")
    for _ in range(epochs):
        order = list(range(len(examples)))
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            chunk = [examples[i] for i in order[start:start + batch_size]]
            width = max(len(a) + len(b) for a, b in chunk)
            ids = torch.full((len(chunk), width), tokenizer.pad_token_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width))
            for row, (prompt, answer) in enumerate(chunk):
                ids[row, : len(prompt) + len(answer)] = torch.tensor(prompt + answer)
                mask[row, len(prompt): len(prompt) + len(answer)] = 1
            yield ids, mask


def train_cpt(cfg: CPTConfig) -> StageResult:
    task = make_task(cfg.task)
    docs = task.cpt_corpus(cfg.corpus_documents, cfg.seed)
    return _train(cfg, "cpt", lambda tok: cpt_batches(tok, docs, cfg.seq_len, cfg.batch_size, cfg.steps, cfg.seed),
                  cfg.steps, task)


def train_sft(cfg: SFTConfig) -> StageResult:
    task = make_task(cfg.task)
    demos = task.sft_demonstrations(cfg.demonstrations, cfg.seed)
    steps = cfg.epochs * -(-len(demos) // cfg.batch_size)
    return _train(cfg, "sft", lambda tok: sft_batches(tok, demos, cfg.batch_size, cfg.epochs, cfg.seed), steps, task)


def _train(cfg: SupervisedConfig, name: str, make_batches, total_steps: int, task) -> StageResult:
    started = time.perf_counter()
    threads = setup_torch(cfg.threads, cfg.seed)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer = load_model_and_tokenizer(cfg.model, seed=cfg.seed)
    model.train()
    optimizer = make_optimizer(model, cfg.lr, cfg.weight_decay)
    scheduler = make_scheduler(optimizer, cfg.warmup_steps, total_steps, cfg.lr_schedule, cfg.min_lr_ratio)
    log = MetricsLog(out / "metrics.jsonl")
    print(f"[{name}] {cfg.model}: {count_parameters(model) / 1e6:.2f}M parameters, {threads} threads, "
          f"{total_steps} steps, run dir {out}")
    skipped = streak = 0
    with StageProgress(name, total_steps) as progress:
        for step, (ids, mask) in enumerate(make_batches(tokenizer), start=1):
            t0 = time.perf_counter()
            logits = model(input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long() if name == "sft" else None).logits
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
    if cfg.eval_problems > 0:
        ev = evaluate(model, tokenizer, task, task.heldout_problems(cfg.eval_problems),
                      max_new_tokens=cfg.eval_max_new_tokens)
        result.accuracy, result.format_accuracy = ev.accuracy, ev.format_accuracy
        log.write({"step": total_steps, "eval_accuracy": ev.accuracy, "eval_format_accuracy": ev.format_accuracy})
    result.seconds = time.perf_counter() - started
    result.write(out / "result.json", config=asdict(cfg))
    return result
