"""Offline preference optimisation (DPO, cDPO, IPO, SimPO, ...) on (prompt, chosen, rejected) pairs.

The reference model's log-probs are computed once, up front, and the reference is then
released, so only the policy stays in memory while training. `train_pairs` is the trainer of
any pair loss; ORPO (lmpo/trainers/orpo.py) uses it too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lmpo.algos import PREFERENCE_LOSSES
from lmpo.algos.preference_mix import is_mix
from lmpo.names import did_you_mean
from lmpo.envs import make_task
from lmpo.envs.data import PreferencePair
from lmpo.models import completion_outputs, load_tokenizer
from lmpo.rollout import left_pad, right_pad
from lmpo.trainers.harness import Run, Updater, preflight_run
from lmpo.trainers.offline import (DataSize, OfflineConfig, mean_over_processes, offline_problems, ordered_batches,
                                   reference_logps, train_offline)
from lmpo.trainers.pairs import PairColumns, embedded_pairs, file_pairs
from lmpo.trainers.result import StageResult
from lmpo.trainers.runtime import options_for
from lmpo.trainers.validation import preference_option_problems, raise_if_any


@dataclass
class PreferenceLoss(OfflineConfig):
    """A pair loss and its options, with the offline trainers' shared options (online DPO's too)."""

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

    def validate(self) -> None:
        raise_if_any("preference", preference_problems(self), self)


@dataclass
class PreferenceConfig(PairColumns, PreferenceLoss):
    """`lmpo train dpo`: a pair loss on the task's pairs or a --data file's."""


def preference_problems(cfg: PreferenceLoss) -> list[str]:
    problems = offline_problems(cfg)
    if is_mix(cfg.loss):
        try:  # a weighted sum: say which part is wrong
            PREFERENCE_LOSSES.get(cfg.loss)
        except ValueError as err:
            problems.append(str(err))
    elif cfg.loss not in PREFERENCE_LOSSES:
        hint = did_you_mean(cfg.loss, PREFERENCE_LOSSES.names())
        problems.append(f"loss={cfg.loss!r}{hint} is not one of {', '.join(PREFERENCE_LOSSES.names())}")
    if not 0 <= cfg.label_smoothing < 0.5:
        problems.append(f"label_smoothing={cfg.label_smoothing} must be in [0, 0.5)")
    return problems + preference_option_problems(cfg)


def preference_options(cfg: PreferenceLoss) -> dict:
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


def last_scored(mask: torch.Tensor) -> torch.Tensor:
    """Per row, the columns up to its last scored one."""
    columns = torch.arange(1, mask.size(1) + 1, device=mask.device)
    return torch.where(mask.bool(), columns, 0).amax(dim=1)


def sequence_logps(model, enc: EncodedPairs) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed completion log-probs of the chosen and rejected answers [B] each, from one forward
    over both (padding-free when that pays)."""
    width = max(enc.chosen.size(1), enc.rejected.size(1))
    widen = lambda t: torch.nn.functional.pad(t, (0, width - t.size(1)))  # noqa: E731 - right padding, masked
    completions, masks = torch.cat([widen(enc.chosen), widen(enc.rejected)]), torch.cat(
        [widen(enc.chosen_mask), widen(enc.rejected_mask)])
    prompts, prompt_mask = enc.prompt_ids.repeat(2, 1), enc.prompt_mask.repeat(2, 1)
    logprobs = completion_outputs(model, prompts, prompt_mask, completions, lengths=last_scored(masks)).logprobs
    summed = (logprobs * masks).sum(1)
    return summed[: enc.prompt_ids.size(0)], summed[enc.prompt_ids.size(0):]


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
    return {"grad_norm": grad_norm, "lr": updater.lr, **mean_over_processes(run, figures)}


def train_preference(cfg: PreferenceConfig) -> StageResult:
    cfg.validate()
    loss_fn = PREFERENCE_LOSSES.get(cfg.loss)
    return train_pairs(cfg, loss_fn, "dpo", cfg.loss, options_for(loss_fn, preference_options(cfg)))


def train_pairs(cfg: OfflineConfig, loss_fn, name: str, label: str, options: dict) -> StageResult:
    """A pair loss (`PREFERENCE_LOSSES`' signature) on the task's pairs or `cfg.data`'s: the run
    named `name` (its trainer), the loss shown as `label`; `options` are the loss's keywords."""
    task = make_task(cfg.task)
    preflight_run(cfg, name)
    tokenizer = load_tokenizer(cfg.model, cfg.trust_remote_code, cfg.chat_template, cfg.chat_template_kwargs)
    if cfg.data:  # the data before the run directory: a bad row says so before anything is written
        pairs = file_pairs(cfg.data, tokenizer, cfg)
    else:
        pairs = embedded_pairs(task, tokenizer, cfg.pairs, cfg.seed)
    run = Run(cfg, name)
    policy = run.load_policy(tokenizer, keep_dropout=cfg.keep_dropout)
    batches = ordered_batches(run, cfg, pairs, lambda share: encode_pairs(share, tokenizer.pad_token_id), "pairs")
    ref = [None] * len(batches)
    if not getattr(loss_fn, "reference_free", False):  # reference log-probs once, up front; then it is gone
        ref = reference_logps(run, policy, batches, sequence_logps)

    def step(trained, updater: Updater, i: int) -> dict:
        return preference_step(run, trained, updater, batches[i], ref[i], loss_fn, cfg, options)

    summary = f"{len(pairs)} pairs x {cfg.epochs} epochs, {label}, beta={cfg.beta}"
    size = DataSize.of(pairs, lambda p: len(p.chosen_ids) + len(p.rejected_ids))
    return train_offline(run, cfg, policy, tokenizer, task, batches, step, label, summary, size)
