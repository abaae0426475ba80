"""KTO (Ethayarajh et al. 2024, "KTO: Model Alignment as Prospect Theoretic Optimization",
arXiv:2402.01306) on unpaired examples: completions labelled desirable or undesirable.

As TRL's `KTOTrainer`: each example's implicit reward ``beta * (pi - ref)`` (summed log-probs) is
judged against the reference point z0, the batch's estimate of KL(pi || ref) from mismatched
(prompt, completion) pairs: each prompt with the previous example's completion in its batch
(TRL shifts the completions by one; lmpo does it on the whole batch, before it is split over
data-parallel processes). z0 is the mean over every process's mismatched pairs, clamped at 0
and detached: the policy's KL log-probs are computed without a graph. The reference's
log-probs, of the examples and of the mismatched pairs, are computed once up front, as DPO's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from lmpo.algos import kto, kto_reference_point
from lmpo.envs import make_task
from lmpo.envs.data.unpaired import UnpairedExample
from lmpo.models import completion_outputs, load_tokenizer
from lmpo.rollout import left_pad, right_pad
from lmpo.trainers.distributed import Distributed
from lmpo.trainers.harness import Run, Updater, preflight_run
from lmpo.trainers.offline import (DataSize, OfflineConfig, mean_over_processes, offline_problems, ordered_batches,
                                   reference_logps, train_offline)
from lmpo.trainers.pairs import UnpairedColumns, embedded_pairs, file_unpaired, unpair
from lmpo.trainers.result import StageResult
from lmpo.trainers.validation import raise_if_any

# The paper's advice: lambda_D * n_D / (lambda_U * n_U) in [1, 4/3].
WEIGHT_RATIO_RANGE = (1.0, 4 / 3)


@dataclass
class KTOConfig(UnpairedColumns, OfflineConfig):
    out: str = "runs/kto"
    """Run directory: metrics.jsonl, checkpoints/, the final model in `model/`, result.json."""
    pairs: int = 2000
    """Task pairs drawn from the training split, each unpaired into two examples: its right answer (desirable) and a wrong one (undesirable)."""
    batch_size: int = 32
    """Examples per optimizer step (at least 2: the reference point scores each prompt with another example's completion)."""
    data: str = ""
    """Train on the examples of this file instead of the task's: JSONL, JSON, CSV/TSV (every value text), Parquet (the text formats also .gz/.bz2/.xz) or a saved `datasets` directory (`DIR::split`) with `prompt`, `completion` (strings, or messages rendered with the chat template) and `label` (true: desirable, false: undesirable; in CSV/TSV also 1/0); both kinds are needed."""
    max_length: int = 1024
    """Longest example from `data` (prompt + completion), in tokens; the model's context where that is shorter."""
    overlong: Literal["error", "skip", "truncate"] = "error"
    """What to do with a longer example from `data`: stop with an error naming it, skip it, or truncate the completion."""
    beta: float = 0.1
    """Scale of the implicit reward beta * (log pi - log ref), i.e. the strength of the KL to the reference (TRL's beta)."""
    desirable_weight: float = 1.0
    """lambda_D: weight of each desirable example's loss."""
    undesirable_weight: float = 1.0
    """lambda_U: weight of each undesirable example's loss (the paper: lambda_D * n_D / (lambda_U * n_U) in [1, 4/3])."""

    def validate(self) -> None:
        problems = offline_problems(self)
        if self.batch_size < 2:
            problems.append(f"batch_size={self.batch_size}: KTO's reference point pairs each prompt with another "
                            f"example's completion, so a batch needs at least 2 examples")
        for name in ("desirable_weight", "undesirable_weight"):
            if getattr(self, name) < 0:
                problems.append(f"{name}={getattr(self, name)} must be >= 0")
        if self.desirable_weight == self.undesirable_weight == 0:
            problems.append("desirable_weight and undesirable_weight are both 0: nothing would be trained")
        raise_if_any("kto", problems, self)


@dataclass
class EncodedUnpaired:
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion: torch.Tensor
    completion_mask: torch.Tensor
    kl_completion: torch.Tensor
    """Example i's prompt is scored with the previous example's completion (see `with_mismatched`)."""
    kl_completion_mask: torch.Tensor
    desirable: torch.Tensor


def with_mismatched(batch: list[UnpairedExample]) -> list[tuple[UnpairedExample, list[int]]]:
    """Each example of a whole batch with the completion its prompt is scored with for the
    reference point: the previous example's (the first takes the last's), as TRL shifts them.
    Made before the batch is split over processes, so any number of processes pairs alike."""
    completions = [e.completion_ids for e in batch]
    return list(zip(batch, completions[-1:] + completions[:-1]))


def encode_unpaired(rows: list[tuple[UnpairedExample, list[int]]], pad_id: int) -> EncodedUnpaired:
    """Prompts left-padded; completions and the mismatched completions right-padded with masks."""
    prompt_ids, prompt_mask = left_pad([e.prompt_ids for e, _ in rows], pad_id)
    completion, completion_mask = right_pad([e.completion_ids for e, _ in rows], pad_id)
    kl_completion, kl_mask = right_pad([kl for _, kl in rows], pad_id)
    desirable = torch.tensor([e.desirable for e, _ in rows], dtype=torch.bool)
    return EncodedUnpaired(prompt_ids, prompt_mask, completion, completion_mask.float(), kl_completion, kl_mask.float(),
                           desirable)


def summed_logps(model, enc: EncodedUnpaired, completion: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (completion_outputs(model, enc.prompt_ids, enc.prompt_mask, completion).logprobs * mask).sum(1)


def unpaired_logps(model, enc: EncodedUnpaired) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probs [B] of each example's completion and of its mismatched one."""
    return (summed_logps(model, enc, enc.completion, enc.completion_mask),
            summed_logps(model, enc, enc.kl_completion, enc.kl_completion_mask))


def reference_point(dist: Distributed, policy_kl: torch.Tensor, ref_kl: torch.Tensor) -> torch.Tensor:
    """z0 from every process's mismatched pairs (TRL gathers them too), clamped at 0, detached."""
    if dist.active:
        device = policy_kl.device
        policy_kl = torch.cat([t.to(device) for t in dist.gather(policy_kl.detach().cpu())])
        ref_kl = torch.cat([t.to(device) for t in dist.gather(ref_kl.detach().cpu())])
    return kto_reference_point(policy_kl, ref_kl)


def kto_loss(policy, enc: EncodedUnpaired, ref: tuple[torch.Tensor, torch.Tensor], cfg: KTOConfig,
             dist: Distributed) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The batch's mean KTO loss on this process's share, and its figures."""
    ref_logps, ref_kl = ref
    logps = summed_logps(policy, enc, enc.completion, enc.completion_mask)
    with torch.no_grad():  # z0 is a constant of the loss: no graph for the mismatched pairs
        policy_kl = summed_logps(policy, enc, enc.kl_completion, enc.kl_completion_mask)
    z0 = reference_point(dist, policy_kl, ref_kl)
    losses, figures = kto(logps, ref_logps, enc.desirable, z0, beta=cfg.beta,
                          desirable_weight=cfg.desirable_weight, undesirable_weight=cfg.undesirable_weight)
    return losses.mean(), {"kl": z0, "reward": figures["reward"], "logps": logps.detach()}


def kind_means(dist: Distributed, values: torch.Tensor, desirable: torch.Tensor) -> dict[str, float]:
    """`values`' mean over the batch's desirable and over its undesirable examples, on every
    process alike; a kind absent from the batch is left out."""
    out = {}
    for kind, mask in (("desirable", desirable), ("undesirable", ~desirable)):
        count = dist.all_sum(float(mask.sum()))
        if count:
            out[kind] = dist.all_sum(values[mask].sum().item()) / count
    return out


def kto_step(run: Run, policy, updater: Updater, enc: EncodedUnpaired, ref, cfg: KTOConfig) -> dict:
    with run.autocast():
        loss, figures = kto_loss(policy, enc, ref, cfg, run.dist)
    _, grad_norm = updater.step(loss)
    row = {"grad_norm": grad_norm, "lr": updater.lr, **mean_over_processes(run, {"loss": loss.detach()}),
           "kl": figures["kl"].item()}
    for name in ("reward", "logps"):
        row.update({f"{kind}_{name}": v for kind, v in kind_means(run.dist, figures[name], enc.desirable).items()})
    if "desirable_reward" in row and "undesirable_reward" in row:
        row["margin"] = row["desirable_reward"] - row["undesirable_reward"]
    return row


def train_kto(cfg: KTOConfig) -> StageResult:
    cfg.validate()
    task = make_task(cfg.task)
    preflight_run(cfg, "kto")
    tokenizer = load_tokenizer(cfg.model, cfg.trust_remote_code, cfg.chat_template, cfg.chat_template_kwargs)
    if cfg.data:  # the data before the run directory: a bad row says so before anything is written
        examples = file_unpaired(cfg.data, tokenizer, cfg)
    else:
        examples = unpair(embedded_pairs(task, tokenizer, cfg.pairs, cfg.seed))
    run = Run(cfg, "kto")
    policy = run.load_policy(tokenizer, keep_dropout=cfg.keep_dropout)
    batches = ordered_batches(run, cfg, examples, lambda share: encode_unpaired(share, tokenizer.pad_token_id),
                              "examples", whole=with_mismatched)
    ref = reference_logps(run, policy, batches, unpaired_logps)  # once, up front; then it is gone

    def step(trained, updater: Updater, i: int) -> dict:
        return kto_step(run, trained, updater, batches[i], ref[i], cfg)

    desirable = sum(e.desirable for e in examples)
    summary = (f"{len(examples)} examples ({desirable} desirable) x {cfg.epochs} epochs, kto, beta={cfg.beta}, "
               f"weights {cfg.desirable_weight}/{cfg.undesirable_weight}")
    ratio = weight_ratio(cfg, desirable, len(examples) - desirable)
    if not WEIGHT_RATIO_RANGE[0] <= ratio <= WEIGHT_RATIO_RANGE[1]:
        run.say(f"note: desirable_weight * n_desirable / (undesirable_weight * n_undesirable) = {ratio:.3g}, outside "
                f"the paper's advice [1, 4/3]; set the weights to bring it in range")
    size = DataSize.of(examples, lambda e: len(e.completion_ids))
    return train_offline(run, cfg, policy, tokenizer, task, batches, step, "kto", summary, size)


def weight_ratio(cfg: KTOConfig, desirable: int, undesirable: int) -> float:
    """lambda_D * n_D / (lambda_U * n_U) (inf without undesirable weight)."""
    denominator = cfg.undesirable_weight * undesirable
    return cfg.desirable_weight * desirable / denominator if denominator else float("inf")
