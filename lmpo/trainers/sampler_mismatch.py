"""The trainer's side of sampling with an engine other than its own forward (vLLM).

Such an engine computes the behaviour log-probs with other kernels and precision, so they are
not the trainer's even with identical weights. Then:

1. pi_old in the PPO ratio is the trainer's own recomputed log-probs of the sampled tokens
   (`recompute_logprobs`), so an on-policy step sees a ratio of exactly 1;
2. each token's policy loss is multiplied by the truncated importance weight
   min(pi_trainer / pi_sampler, C) (`correct_for_sampler`; Yao et al. 2025), which corrects
   for the tokens having been drawn from the sampler's distribution;
3. after every update the engine receives the new weights and is probed
   (`sync_and_probe`), so stale weights stop the run instead of training silently off-policy.

The built-in engine samples with the trainer's own model and forward: none of this applies.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from lmpo.algos import mismatch_kl, tis_clipped, truncated_importance_weights
from lmpo.models import completion_outputs
from lmpo.rollout.engines import LocalEngine
from lmpo.rollout.weight_probe import probe_engine


def samples_with_trainer_forward(engine) -> bool:
    """True for the built-in engine: its behaviour log-probs are the trainer's forward's."""
    return isinstance(engine, LocalEngine)


def correct_for_sampler(batch_old_logprobs: Tensor, trainer_logprobs: Tensor, mask: Tensor,
                        cap: float) -> tuple[Tensor, Tensor, dict[str, float]]:
    """(pi_old for the ratio, per-token TIS weights, figures to log).

    `batch_old_logprobs` are the sampler's behaviour log-probs, `trainer_logprobs` the trainer's
    recomputed ones of the same tokens, `mask` the loss mask; `cap` = 0 turns the reweighting off
    (weights 1 on the mask). Figures: `mismatch_kl` (k3 estimate of KL(sampler || trainer) per
    token), `mismatch_kl_k1`, `tis_weight_mean` and `tis_clipped_frac` over the loss tokens."""
    trainer_logprobs = trainer_logprobs.detach().float()
    kl = mismatch_kl(trainer_logprobs, batch_old_logprobs, mask)
    valid = (mask != 0).float()
    tokens = valid.sum().clamp(min=1)
    if cap:
        weights = truncated_importance_weights(trainer_logprobs, batch_old_logprobs, mask, cap)
        clipped = (tis_clipped(trainer_logprobs, batch_old_logprobs, mask, cap).sum() / tokens).item()
    else:
        weights, clipped = valid, 0.0
    figures = {"mismatch_kl": kl.k3.item(), "mismatch_kl_k1": kl.k1.item(),
               "tis_weight_mean": ((weights * valid).sum() / tokens).item(), "tis_clipped_frac": clipped}
    return trainer_logprobs, weights, figures if valid.any() else {}  # means over no token are no figures


@torch.no_grad()
def recompute_logprobs(policy: torch.nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                       temperature: float, chunk: int = 0) -> Tensor:
    """The trainer's log-probs [B, T] of the sampled tokens, in the mode of the loss forward (the
    caller's), `chunk` sequences per forward (0 = all at once)."""
    size = completion_ids.size(0)
    step = chunk or size
    parts = [completion_outputs(policy, prompt_ids[i:i + step], prompt_mask[i:i + step], completion_ids[i:i + step],
                                temperature).logprobs for i in range(0, size, step)]
    return torch.cat(parts).float()


def sync_and_probe(engine, policy: torch.nn.Module, probe_ids: Sequence[int], tolerance: float) -> dict[str, float]:
    """Give the engine the policy's new weights and check it samples from them (raises
    `StaleWeightsError` otherwise; `tolerance` 0 = no probe). Returns the probe's figures."""
    engine.sync_weights(policy)
    if not tolerance:
        return {}
    return probe_engine(engine, policy, probe_ids, tolerance).metrics()
