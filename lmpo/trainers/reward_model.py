"""Reward-model training with the Bradley–Terry loss on (prompt, chosen, rejected) pairs.

The model is an ordinary `AutoModelForSequenceClassification` with one output; its score is
read at the last non-padding token (transformers' own pooling), so the saved directory loads
and scores with plain transformers.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification

from lmpo.algos import bradley_terry_loss
from lmpo.envs import make_task
from lmpo.models import is_preset, load_tokenizer, preset_config, save_model
from lmpo.rollout import right_pad
from lmpo.trainers.progress import StageProgress
from lmpo.trainers.result import StageResult
from lmpo.trainers.runtime import (MetricsLog, Schedule, grad_norm_and_clip, make_optimizer, make_scheduler,
                                   setup_torch)


@dataclass
class RewardModelConfig:
    model: str = "runs/sft/model"
    """Hugging Face model directory (or preset) whose trunk the reward model starts from."""
    task: str = "sort_digits"
    """Task that supplies the embedded preference pairs."""
    out: str = "runs/rm"
    """Run directory: metrics.jsonl, the reward model in `model/`, result.json."""
    seed: int = 0
    """Seed for the pairs and their order."""
    threads: int = 2
    """Torch CPU threads (0 = one per core)."""
    pairs: int = 2000
    """Training pairs drawn from the task's training split."""
    heldout_pairs: int = 500
    """Held-out pairs (from held-out problems) for pairwise accuracy."""
    epochs: int = 2
    """Passes over the training pairs."""
    batch_size: int = 32
    """Pairs per optimizer step."""
    lr: float = 3e-4
    """Peak learning rate of AdamW."""
    warmup_steps: int = 10
    """Steps of linear warm-up."""
    lr_schedule: Schedule = "cosine"
    """Decay after warm-up: cosine, linear or constant."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of the peak."""
    weight_decay: float = 0.0
    """AdamW weight decay (matrices only)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 = off)."""
    margin: float = 0.0
    """Bradley–Terry margin m: the loss asks for r_chosen - r_rejected > m."""
    center_coef: float = 0.0
    """Coefficient of the centering term c*(r_chosen + r_rejected)^2 (Eisenstein et al. 2023)."""
    log_every: int = 10
    """Write a metrics row every this many steps."""


def load_reward_model(name_or_path: str, tokenizer, seed: int):
    if is_preset(name_or_path):
        config = preset_config(name_or_path, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id,
                               tokenizer.bos_token_id)
        config.num_labels = 1
        torch.manual_seed(seed)
        return AutoModelForSequenceClassification.from_config(config)
    return AutoModelForSequenceClassification.from_pretrained(name_or_path, num_labels=1)


def encode_pair_batch(tokenizer, pairs) -> tuple[torch.Tensor, torch.Tensor]:
    """Chosen rows then rejected rows: prompt + answer + EOS, right-padded."""
    texts = [p.prompt + c for p, c, _ in pairs] + [p.prompt + r for p, _, r in pairs]
    ids = [tokenizer(t, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for t in texts]
    return right_pad(ids, tokenizer.pad_token_id)


def scores(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    return model(input_ids=input_ids, attention_mask=attention_mask).logits.squeeze(-1).float()


@torch.no_grad()
def pairwise_accuracy(model, tokenizer, pairs, batch_size: int = 128) -> float:
    model.eval()
    right = 0
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start:start + batch_size]
        s = scores(model, *encode_pair_batch(tokenizer, chunk))
        right += int((s[: len(chunk)] > s[len(chunk):]).sum())
    model.train()
    return right / max(len(pairs), 1)


def train_reward_model(cfg: RewardModelConfig) -> StageResult:
    started = time.perf_counter()
    threads = setup_torch(cfg.threads, cfg.seed)
    task = make_task(cfg.task)
    if not hasattr(task, "preference_pairs"):
        raise ValueError(f"task {cfg.task!r} has no embedded preference pairs")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(cfg.model)
    model = load_reward_model(cfg.model, tokenizer, cfg.seed)
    model.config.pad_token_id = tokenizer.pad_token_id
    train_pairs = task.preference_pairs(cfg.pairs, cfg.seed)
    heldout = task.preference_pairs(cfg.heldout_pairs, cfg.seed, heldout=True)
    steps = cfg.epochs * -(-len(train_pairs) // cfg.batch_size)
    optimizer = make_optimizer(model, cfg.lr, cfg.weight_decay)
    scheduler = make_scheduler(optimizer, cfg.warmup_steps, steps, cfg.lr_schedule, cfg.min_lr_ratio)
    log = MetricsLog(out / "metrics.jsonl")
    print(f"[rm] {cfg.model}: {len(train_pairs)} pairs x {cfg.epochs} epochs, {threads} threads, run dir {out}")
    rng = random.Random(f"rm-order:{cfg.seed}")
    model.train()
    step = 0
    with StageProgress("rm", steps) as progress:
        for _ in range(cfg.epochs):
            order = list(range(len(train_pairs)))
            rng.shuffle(order)
            for start in range(0, len(order), cfg.batch_size):
                chunk = [train_pairs[i] for i in order[start:start + cfg.batch_size]]
                s = scores(model, *encode_pair_batch(tokenizer, chunk))
                loss, figures = bradley_terry_loss(s[: len(chunk)], s[len(chunk):], margin=cfg.margin,
                                                   center_coef=cfg.center_coef)
                loss = loss.mean()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = grad_norm_and_clip(model, cfg.grad_clip)
                optimizer.step()
                scheduler.step()
                step += 1
                row = {"step": step, "loss": loss.item(), "accuracy": figures["accuracy"].mean().item(),
                       "margin": figures["margin"].mean().item(), "grad_norm": grad_norm, "lr": scheduler.get_last_lr()[0]}
                if step % cfg.log_every == 0 or step == steps:
                    log.write(row)
                progress.update(step, loss=row["loss"], acc=row["accuracy"])
    accuracy = pairwise_accuracy(model, tokenizer, heldout)
    log.write({"step": step, "eval_accuracy": accuracy})
    save_model(model, tokenizer, out / "model")
    result = StageResult(name="rm", seconds=time.perf_counter() - started, model_dir=str(out / "model"),
                         run_dir=str(out), accuracy=accuracy)
    result.write(out / "result.json", config=asdict(cfg), metric="held-out pairwise accuracy")
    print(f"[rm] held-out pairwise accuracy {100 * accuracy:.1f}% on {len(heldout)} pairs")
    return result
