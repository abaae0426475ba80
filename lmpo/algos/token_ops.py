"""Token-level ops on logits: log-probs of chosen tokens, entropy, masked cross-entropy.

All results are fp32 whatever the dtype of the logits, except fp64 logits, which stay fp64 (the
worked examples of `lmpo explain` compute in fp64, so that their printed digits do not depend on
a machine's fp32 rounding: k3 of one came out 0.0468237 on one CPU and 0.0468238 on another).
Logits are assumed already aligned with their targets (``logits[..., t, :]`` scores
``targets[..., t]``): the caller shifts.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _scaled(logits: Tensor, temperature: float) -> Tensor:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logits = logits if logits.dtype == torch.float64 else logits.float()
    return logits if temperature == 1.0 else logits / temperature


def token_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """``log softmax(logits / temperature)[targets]``, fp32 (or fp64), shape of ``targets``.

    Computed as ``z[target] - logsumexp(z)`` so that no full [.., V] log-softmax tensor is
    materialised besides the fp32 (scaled) logits. ``targets`` must be valid token ids.
    """
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets shape {tuple(targets.shape)} must be logits shape {tuple(logits.shape)} without its last (vocabulary) dim")
    z = _scaled(logits, temperature)
    chosen = z.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(z, dim=-1)


def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy ``H = logsumexp(z) - sum_v softmax(z)_v * z_v`` of ``z = logits / temperature``, fp32.

    Vocabulary entries with logit -inf (e.g. masked by top-k) have probability 0 and
    contribute 0 (not NaN) to the value and the gradient.
    """
    z = _scaled(logits, temperature)
    lse = torch.logsumexp(z, dim=-1, keepdim=True)
    probs = (z - lse).exp()
    finite_z = torch.where(torch.isfinite(z), z, 0.0)
    return lse.squeeze(-1) - (probs * finite_z).sum(-1)


def masked_cross_entropy(
    logits: Tensor,
    targets: Tensor,
    mask: Tensor,
    *,
    num_tokens: float | None = None,
) -> Tensor:
    """Mean token cross-entropy over ``mask != 0``: ``-sum_t mask_t log p(targets_t) / num_tokens``.

    The SFT completion-only loss (prompt and padding masked), or the CPT loss with an all-ones
    mask. ``num_tokens`` defaults to ``mask`` 's count; pass the whole global batch's count
    under gradient accumulation so that micro-batch losses sum to the whole-batch loss.
    Targets at masked positions may be anything (e.g. -100). An empty mask gives 0 (with grad).
    """
    if logits.shape[:-1] != targets.shape or targets.shape != mask.shape:
        raise ValueError(
            f"shapes disagree: logits {tuple(logits.shape)}, targets {tuple(targets.shape)}, "
            f"mask {tuple(mask.shape)}"
        )
    valid = mask != 0
    safe_targets = torch.where(valid, targets.long(), 0)
    nll = -token_logprobs(logits, safe_targets)
    total = torch.where(valid, nll, 0.0).sum()
    denom = torch.as_tensor(
        valid.sum() if num_tokens is None else num_tokens, dtype=total.dtype, device=total.device
    )
    return total / torch.where(denom > 0, denom, torch.ones_like(denom))
