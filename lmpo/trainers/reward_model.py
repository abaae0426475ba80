"""Reward-model training with the Bradley–Terry loss on (prompt, chosen, rejected) pairs.

The model is an ordinary `AutoModelForSequenceClassification` with one output, so the saved
directory loads and scores with plain transformers. Its score is read at each row's last real
token, which is where transformers' own pooling reads it too, unless the pad token is the EOS
(then transformers reads the token before a closing EOS; see `last_token_scores`).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from transformers import AutoModelForSequenceClassification

from lmpo.algos import bradley_terry_loss
from lmpo.envs import make_task
from lmpo.envs.data.chat import turn_end_ids
from lmpo.envs.data.reward_rows import REWARD_ROWS_FILE
from lmpo.envs.data.preferences import TEXT_SHAPES
from lmpo.models import is_adapter_dir, is_peft_model, is_preset, load_model, load_tokenizer, preset_config
from lmpo.models.loading import name_by_path
from lmpo.models.packing import can_pack_trunk, last_states, trunk_layout
from lmpo.models.reward_scorer import last_token_scores
from lmpo.models.padding import left_pad, right_pad
from lmpo.trainers.distributed import equal_split_refusal, launched_world, say
from lmpo.trainers.faults import fault_point
from lmpo.trainers.harness import Run, RunOptions, Updater, preflight_run
from lmpo.trainers.pairs import PairColumns, embedded_pairs, file_pairs, scoring_rows, split_heldout
from lmpo.trainers.result import StageResult
from lmpo.trainers.validation import (at_least, checkpoint_problems, data_option_problems, optimizer_problems,
                                     raise_if_any)
from lmpo.trainers.runtime import Schedule, make_optimizer, make_scheduler, preserved_rng
from lmpo.trainers.batches import EpochOrder


@dataclass
class RewardModelConfig(PairColumns, RunOptions):
    model: str = "runs/sft/model"
    """Hugging Face model directory (or preset) whose trunk the reward model starts from."""
    task: str = "sort_digits"
    """Task that supplies the embedded preference pairs."""
    out: str = "runs/rm"
    """Run directory: metrics.jsonl, checkpoints/, the reward model in `model/`, result.json."""
    resume: str = ""
    """Run directory of an interrupted run to continue from its newest complete checkpoint; repeat its options."""
    seed: int = 0
    """Seed for the pairs and their order."""
    threads: int = 2
    """Torch CPU threads (0 = one per core)."""
    pairs: int = 10_000
    """Training pairs drawn from the task's training split (with 2000, PPO found wrong answers the reward model preferred)."""
    heldout_pairs: int = 500
    """Held-out pairs (from held-out problems) for pairwise accuracy."""
    epochs: int = 3
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
    save_every: int = 50
    """Write a resumable checkpoint every this many steps (0 = only the final model)."""
    keep_checkpoints: int = 2
    """Complete checkpoints to keep."""
    data: str = ""
    """Train on the pairs of this file instead of the task's: JSONL, JSON, CSV/TSV (every value text), Parquet (the text formats also .gz/.bz2/.xz) or a saved `datasets` directory (`DIR::split`) with `prompt`, `chosen`, `rejected` (strings, or message lists rendered with the chat template)."""
    heldout_data: str = ""
    """Measure pairwise accuracy on this file's pairs (with or without `data`); without it, `heldout_pairs` pairs of `data` (or of the task's held-out pairs) are held out (seeded)."""
    max_length: int = 1024
    """Longest pair from `data` (prompt + longer reply), in tokens; the model's context where that is shorter."""
    overlong: Literal["error", "skip", "truncate"] = "error"
    """What to do with a longer pair from `data`: stop with an error naming it, skip it, or truncate the replies."""

    def validate(self) -> None:
        problems = at_least(self, 1, "pairs", "heldout_pairs", "batch_size", "epochs", "log_every", "max_length")
        problems += at_least(self, 0, "margin", "center_coef") + optimizer_problems(self) + checkpoint_problems(self)
        problems += data_option_problems(self)
        raise_if_any("reward model", problems, self)


def load_reward_model(name_or_path: str, tokenizer, seed: int, trust_remote_code: bool = False):
    """A one-label sequence classifier from `name_or_path`: a preset (built from `seed`), a model
    directory (its trunk, a fresh score head), or a LoRA stage's adapter directory (the model it
    merges into, a fresh score head; transformers would load it with the adapter unmerged and
    frozen: a reward model with nothing to train)."""
    if is_adapter_dir(name_or_path):
        causal = load_model(name_or_path, tokenizer, seed=seed, trust_remote_code=trust_remote_code)
        config = copy.deepcopy(causal.config)
        config.num_labels = 1
        torch.manual_seed(seed)
        model = AutoModelForSequenceClassification.from_config(config)
        model.base_model.load_state_dict(causal.base_model.state_dict())
        model.name_or_path = causal.name_or_path
        return model
    if is_preset(name_or_path):
        config = preset_config(name_or_path, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id,
                               tokenizer.bos_token_id)
        config.num_labels = 1
        torch.manual_seed(seed)
        return AutoModelForSequenceClassification.from_config(config)
    return name_by_path(AutoModelForSequenceClassification.from_pretrained(name_or_path, num_labels=1,
                                                                           trust_remote_code=trust_remote_code),
                        name_or_path)


def scores(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Each row's score at its last real token, where the packed forward reads it (see
    `last_token_scores`)."""
    return last_token_scores(model, input_ids, attention_mask)


def pair_scores(model, pairs: list, pad_id: int, device) -> torch.Tensor:
    """Scores of every pair's chosen answer, then of every rejected one [2B]: one padding-free
    forward holding each prompt once where the model allows it (the same scores to float
    tolerance), else the padded rows of `scoring_rows`."""
    head, trunk = getattr(model, "score", None), getattr(model, "base_model", model)
    packable = (isinstance(head, torch.nn.Linear) and trunk is not model and not is_peft_model(model)
                and can_pack_trunk(trunk) and all(p.prompt_ids and p.chosen_ids and p.rejected_ids for p in pairs))
    if packable:
        prompt_ids, prompt_mask = left_pad([p.prompt_ids for p in pairs] * 2, pad_id)
        answers, mask = right_pad([p.chosen_ids for p in pairs] + [p.rejected_ids for p in pairs], pad_id)
        layout = trunk_layout(trunk, prompt_ids, prompt_mask, mask.sum(1))
    if not packable or layout.kind == "padded":
        return scores(model, *(t.to(device) for t in scoring_rows(pairs, pad_id)))
    states = last_states(trunk, prompt_ids.to(device), prompt_mask.to(device), answers.to(device),
                         mask.sum(1).to(device), layout)
    return head(states).squeeze(-1).float()


@torch.no_grad()
def pairwise_accuracy(model, tokenizer, pairs, batch_size: int = 128, device: torch.device | str = "cpu") -> float:
    model.eval()
    right = 0
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start:start + batch_size]
        s = scores(model, *(t.to(device) for t in scoring_rows(chunk, tokenizer.pad_token_id))).cpu()
        right += int((s[: len(chunk)] > s[len(chunk):]).sum())
    model.train()
    return right / max(len(pairs), 1)


def reward_model_pairs(cfg: RewardModelConfig, task, tokenizer,
                       shapes: list[str] | None = None) -> tuple[list, list]:
    """(training pairs, held-out pairs) from the task or from the user's files; `heldout_data`,
    when given, is the held-out set whichever pairs are trained on. The training file's row
    shape is appended to `shapes` (none for the task's pairs, which are text)."""
    heldout = file_pairs(cfg.heldout_data, tokenizer, cfg) if cfg.heldout_data else None
    if not cfg.data:
        return (embedded_pairs(task, tokenizer, cfg.pairs, cfg.seed),
                heldout or embedded_pairs(task, tokenizer, cfg.heldout_pairs, cfg.seed, heldout=True))
    pairs = file_pairs(cfg.data, tokenizer, cfg, shapes)
    if heldout is not None:
        seen = {(tuple(p.prompt_ids), tuple(p.chosen_ids), tuple(p.rejected_ids)) for p in pairs}
        both = sum((tuple(p.prompt_ids), tuple(p.chosen_ids), tuple(p.rejected_ids)) in seen for p in heldout)
        if both:
            say(f"[data] warning: {both} of the {len(heldout)} pairs of --heldout_data {cfg.heldout_data} are "
                f"training pairs too: held-out accuracy on them measures what training saw")
        return pairs, heldout
    return split_heldout(pairs, cfg.heldout_pairs, cfg.seed, cfg.data)


def train_reward_model(cfg: RewardModelConfig) -> StageResult:
    cfg.validate()
    task = make_task(cfg.task)
    preflight_run(cfg, "rm")
    tokenizer = load_tokenizer(cfg.model, cfg.trust_remote_code, cfg.chat_template, cfg.chat_template_kwargs)
    # the data before the run directory: a bad row says so before anything is written
    shapes: list[str] = []
    train_pairs, heldout = reward_model_pairs(cfg, task, tokenizer, shapes)
    if refusal := equal_split_refusal(len(train_pairs), cfg.batch_size, launched_world(), "pairs"):
        raise ValueError(refusal)  # the figures are means over equal shares
    run = Run(cfg, "rm")
    model = load_reward_model(cfg.model, tokenizer, cfg.seed, cfg.trust_remote_code)
    model.config.pad_token_id = tokenizer.pad_token_id
    model = run.prepare(model, train_in_full=("score",))
    steps = cfg.epochs * -(-len(train_pairs) // cfg.batch_size)
    optimizer = make_optimizer(model, cfg.lr, cfg.weight_decay)
    scheduler = make_scheduler(optimizer, cfg.warmup_steps, steps, cfg.lr_schedule, cfg.min_lr_ratio)
    updater = Updater(optimizer, scheduler, cfg.grad_clip, cfg.max_nonfinite_steps, "rm")
    order = EpochOrder(len(train_pairs), cfg.batch_size, cfg.epochs, f"rm-order:{cfg.seed}")
    resumed = run.resume(model, optimizer, scheduler)
    step = 0
    if resumed is not None:
        order.load_state_dict(resumed.data)
        step = resumed.step
        updater.load_state(resumed.state)
    if resumed is None:  # the starting point of the curves, without moving the random state training reads
        with preserved_rng():
            run.write({"step": 0, "eval_accuracy": pairwise_accuracy(run.plain(model), tokenizer, heldout,
                                                                     device=run.device)})
    run.say(f"{cfg.model}: {len(train_pairs)} pairs x {cfg.epochs} epochs; {run.describe(model)}")
    model.train()
    trained = run.trained(model)
    with run.progress(steps, initial=step) as progress:
        for indices in order:
            chunk = run.dist.shard([train_pairs[i] for i in indices], "pairs")
            with run.autocast():
                s = pair_scores(trained, chunk, tokenizer.pad_token_id, run.device)
            loss, figures = bradley_terry_loss(s[: len(chunk)], s[len(chunk):], margin=cfg.margin,
                                               center_coef=cfg.center_coef)
            loss = loss.mean()
            _, grad_norm = updater.step(loss)
            step += 1
            mean = lambda v: run.dist.all_sum(float(v)) / run.dist.world  # noqa: E731 - equal shares per process
            row = {"step": step, "loss": mean(loss.item()), "accuracy": mean(figures["accuracy"].mean().item()),
                   "margin": mean(figures["margin"].mean().item()), "grad_norm": grad_norm, "lr": updater.lr}
            if updater.streak:
                row["skipped_updates"] = updater.skipped
            if step % cfg.log_every == 0 or step == steps or updater.streak:
                run.write(row)
            updater.check(step)
            progress.update(step, loss=row["loss"], acc=row["accuracy"])
            if run.checkpoint_due(step, steps):
                run.checkpoint(step, model, tokenizer, optimizer, scheduler, state=updater.state(),
                               data_state=order.state_dict())
            if order.at_epoch_end:
                fault_point("epoch_end", step)
            fault_point("step_end", step)
    run.sync(model)
    accuracy = pairwise_accuracy(run.plain(model), tokenizer, heldout, device=run.device)
    run.write({"step": step, "eval_accuracy": accuracy})
    run.say(f"held-out pairwise accuracy {100 * accuracy:.1f}% on {len(heldout)} pairs")
    result = StageResult(name="rm", seconds=0.0, model_dir="", run_dir=str(run.out), accuracy=accuracy)
    result = run.finish(model, tokenizer, result, metric="held-out pairwise accuracy")
    if run.dist.is_main:
        record_rows(Path(result.model_dir), tokenizer, chat=any(s not in TEXT_SHAPES for s in shapes))
    return result


def record_rows(model_dir: Path, tokenizer, chat: bool) -> None:
    """How the rows were encoded, beside the model (and its merged copy), for the `rm` reward to
    score completions as they were trained (`lmpo.envs.rewards.chat_rows`)."""
    text = json.dumps({"rows": "chat" if chat else "text", "turn_ends": turn_end_ids(tokenizer) if chat else []})
    for directory in (model_dir, model_dir / "merged"):
        if directory.is_dir():
            (directory / REWARD_ROWS_FILE).write_text(text + "\n")
