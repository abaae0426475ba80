"""The update phase: several passes of minibatch steps over one rollout batch, each step
accumulated over micro-batches with the minibatch's global denominators, so the gradient does
not depend on `micro_batch_size`."""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Iterator

import torch

from lmpo.algos import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES, clipped_value_loss
from lmpo.models import ValueHead, ValueModel, completion_outputs, micro_batches
from lmpo.trainers.rl_batch import Batch
from lmpo.trainers.rl_config import RLConfig
from lmpo.trainers.distributed import Distributed, unwrap
from lmpo.trainers.harness import Updater
from lmpo.trainers.ptx import ptx_backward
from lmpo.trainers.runtime import options_for

# means over the trained tokens (or aggregates of them): undefined where a minibatch has none
TOKEN_FIGURES = ("loss", "policy_loss", "value_loss", "clip_frac", "value_clip_frac", "entropy", "kl")
ONCE_A_BATCH = ("sampler_kl",)  # measured on the batch's on-policy minibatch only


@dataclass
class LossParts:
    """The named parts of the objective, resolved from a config once."""

    policy_loss: object
    aggregate: object
    kl: object
    options: dict
    kl_in_loss: bool
    critic: ValueHead | ValueModel | None = None

    @classmethod
    def from_config(cls, cfg: RLConfig, critic=None) -> "LossParts":
        options = {"clip_eps_low": cfg.clip_eps_low, "clip_eps_high": cfg.clip_eps_high,
                   "dual_clip": cfg.dual_clip or None, "max_len": cfg.max_len_norm or cfg.max_new_tokens,
                   "ratio_cap": cfg.ratio_cap or None, "ratio_level": cfg.ratio_level}
        return cls(POLICY_LOSSES.get(cfg.loss), AGGREGATIONS.get(cfg.aggregation), KL_ESTIMATORS.get(cfg.kl_estimator),
                   options, cfg.kl_placement == "loss", critic)


def update(policy, updater: Updater, batch: Batch, cfg: RLConfig, parts: LossParts, beta: float,
           ctx: Distributed = Distributed(), autocast=nullcontext, ptx: Iterator[tuple] | None = None) -> dict:
    """`num_iterations` passes of `num_minibatches` optimizer steps over the batch (this process's
    share of it when several train: the token and sequence counts are global, so the update is
    the one-process update on the whole batch; with several minibatches each process shuffles
    its own share, so a minibatch is every process's random part of its share). Figures are
    means over the applied updates; a figure over the trained tokens (loss, entropy, KL, clip
    fractions) only over the updates that had some, and absent when none had: with every episode
    masked it would read 0, which is no measurement (an "entropy collapse" to the collapse guard).
    A minibatch without a trained token (on any process) takes no optimizer step, not even
    the schedule's, as a skipped non-finite one; unlike that, it is not counted as skipped.
    `trained_tokens` counts the batch's loss tokens. `ptx` (PPO-ptx, with `ptx_coef` > 0): batches
    of which each optimizer step adds `ptx_coef` × the next one's NLL."""
    size = batch.completion_ids.size(0)
    mb_size = size // cfg.num_minibatches
    sums: dict[str, float] = {}
    with_tokens = applied_updates = 0
    skipped_before = updater.skipped
    several = cfg.num_iterations * cfg.num_minibatches > 1
    order_gen = torch.Generator().manual_seed(cfg.seed)
    for iteration in range(cfg.num_iterations):
        order = torch.randperm(size, generator=order_gen) if cfg.num_minibatches > 1 else torch.arange(size)
        for start in range(0, size, mb_size):
            rows_of_batch = order[start:start + mb_size]
            minibatch = batch.select(rows_of_batch)
            # the first minibatch runs on the weights that sampled the batch: its π_old is its own
            # forward, so its ratio is exactly 1 (the log-prob pass batches the rows otherwise)
            on_policy = batch.on_policy and iteration == 0 and start == 0
            micro_rows = micro_batch_rows(minibatch, cfg)
            taken: list[torch.Tensor] | None = [] if on_policy and several else None
            # global counts over processes, divided by their number: DDP averages the gradients
            counts = {"num_sequences": ctx.all_sum(int((minibatch.loss_mask.sum(dim=1) > 0).sum())) / ctx.world,
                      "num_tokens": ctx.all_sum(minibatch.loss_mask.sum().item()) / ctx.world,
                      "max_len": parts.options["max_len"]}
            if counts["num_tokens"] == 0 and not (ptx is not None and cfg.ptx_coef):
                continue  # nothing to train: an optimizer step on zero gradients would still move the
                # weights (Adam's momentum, weight decay); the count is global, so every process skips
            updater.zero()
            with autocast():
                shares = [micro_step(policy, minibatch.select(torch.tensor(rows)), cfg, parts, counts, beta,
                                     on_policy, taken)
                          for rows in micro_rows]
                if ptx is not None and cfg.ptx_coef:
                    shares.append({"ptx_loss": ptx_backward(policy, next(ptx), cfg.ptx_coef, ctx)})
            if taken is not None:  # the later passes take the same π_old for these rows
                batch.old_logprobs = batch.old_logprobs.clone()
                for rows, old in zip(micro_rows, taken):
                    batch.old_logprobs[rows_of_batch[rows], :old.size(1)] = old.to(batch.old_logprobs)
            finite = all(math.isfinite(v) for s in shares for key, v in s.items() if key in ("loss", "ptx_loss"))
            applied, grad_norm = updater.apply(ctx.all_true(finite))
            if not applied:  # a non-finite loss or gradient never reaches the weights
                continue
            applied_updates += 1
            with_tokens += counts["num_tokens"] > 0  # the same on every process: the count is global
            for share in shares:
                if counts["num_tokens"] == 0:
                    share = {key: value for key, value in share.items() if key not in TOKEN_FIGURES + ONCE_A_BATCH}
                for key, value in share.items():  # the ptx loss is a mean over processes already
                    sums[key] = sums.get(key, 0.0) + (value if key == "ptx_loss" else ctx.all_sum(value) / ctx.world)
            sums["grad_norm"] = sums.get("grad_norm", 0.0) + grad_norm
    skipped = updater.skipped - skipped_before
    per = {k: 1 if k in ONCE_A_BATCH else with_tokens if k in TOKEN_FIGURES else applied_updates for k in sums}
    return {**{k: v / max(per[k], 1) for k, v in sums.items()},
            "skipped_updates": skipped, "trained_tokens": int(ctx.all_sum(batch.loss_mask.sum().item()))}


def micro_batch_rows(minibatch: Batch, cfg: RLConfig) -> list[list[int]]:
    """The minibatch's rows per micro-batch: `micro_batch_tokens` packs rows of similar length under
    a token budget (rows x longest, after trimming padding); else `micro_batch_size` rows each.
    The loss is normalised by the whole minibatch's counts, so the split never changes the gradient."""
    size = minibatch.completion_ids.size(0)
    if cfg.micro_batch_tokens:
        lengths = (minibatch.prompt_mask.sum(1) + minibatch.real_completion_lengths()).tolist()
        return micro_batches([int(n) for n in lengths], cfg.micro_batch_tokens)
    micro = cfg.micro_batch_size or size
    return [list(range(m, min(m + micro, size))) for m in range(0, size, micro)]


def micro_step(policy, part: Batch, cfg: RLConfig, parts: LossParts, counts: dict, beta: float,
               on_policy: bool = False, taken: list | None = None) -> dict:
    """Forward, loss and backward for one micro-batch; returns its share of the figures.

    `on_policy` (the first update of a batch the current weights sampled): π_old is this forward's
    own log-probs, detached, so the ratio is exactly 1 (the sampler's, and those of the log-prob
    pass, which lays the whole batch out otherwise, differ by float error); `taken` receives them."""
    head_on_trunk = isinstance(unwrap(parts.critic), ValueHead)
    part = part.to(next(policy.parameters()).device)
    if cfg.micro_batch_tokens:  # the budget counts trimmed rows; without one, shapes stay as sampled
        part = part.trimmed()
    out = completion_outputs(policy, part.prompt_ids, part.prompt_mask, part.completion_ids, cfg.temperature,
                             entropy=True, entropy_grad=cfg.entropy_coef > 0, hidden=head_on_trunk,
                             chunk_tokens=cfg.logprob_chunk_tokens, lengths=part.real_completion_lengths())
    mask = part.loss_mask
    old = out.logprobs.detach() if on_policy else part.old_logprobs
    if on_policy and taken is not None:
        taken.append(old.cpu())
    token_loss, info = parts.policy_loss(out.logprobs, old, part.advantages, mask,
                                         **options_for(parts.policy_loss, parts.options))
    if part.tis_weights is not None:  # only the policy-gradient term is the sampler's to correct
        token_loss = token_loss * part.tis_weights
    policy_term = token_loss.detach()
    kl = None
    if part.ref_logprobs is not None:
        kl = parts.kl(out.logprobs, part.ref_logprobs, **options_for(parts.kl, {"old_logprobs": old}))
        if parts.kl_in_loss:
            token_loss = token_loss + beta * torch.where(mask.bool(), kl, torch.zeros_like(kl))
    if cfg.entropy_coef > 0:
        token_loss = token_loss - cfg.entropy_coef * torch.where(mask.bool(), out.entropy, torch.zeros_like(out.entropy))
    agg = options_for(parts.aggregate, counts)
    loss = parts.aggregate(token_loss, mask, **agg)
    share = {"policy_loss": parts.aggregate(policy_term, mask, **agg).item()}  # the KL and entropy terms apart
    if parts.critic is not None:
        values = parts.critic(out.hidden) if head_on_trunk else parts.critic(part.prompt_ids, part.prompt_mask,
                                                                              part.completion_ids)
        value_loss, value_info = clipped_value_loss(values, part.old_values, part.returns, mask,
                                                    clip_eps_value=cfg.clip_eps_value or None)
        value_loss = parts.aggregate(value_loss, mask, **agg)
        loss = loss + cfg.vf_coef * value_loss
        share["value_loss"] = value_loss.item()
        share["value_clip_frac"] = _token_share(value_info["clipped"], mask, counts)
    loss.backward()
    share["loss"] = loss.item()
    if on_policy and part.tis_weights is None and part.sampler_logprobs is not None:
        # the built-in engine sampled with these very weights: its log-probs (the decode kernels')
        # differ from this forward's by float error only; a sampler that drew from another
        # distribution would show here, where the ratio (exactly 1) cannot show it
        sampler_kl = KL_ESTIMATORS.get("k3")(part.sampler_logprobs, out.logprobs.detach())
        share["sampler_kl"] = _token_share(sampler_kl, mask, counts)
    share["clip_frac"] = _token_share(info["clipped"], mask, counts)
    share["entropy"] = _token_share(out.entropy, mask, counts)
    if kl is not None:
        share["kl"] = _token_share(kl, mask, counts)
    return share


def _token_share(per_token: torch.Tensor, mask: torch.Tensor, counts: dict) -> float:
    return (per_token.detach() * mask).sum().item() / max(counts["num_tokens"], 1)
