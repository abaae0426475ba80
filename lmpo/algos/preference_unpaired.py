"""KTO (unpaired desirable / undesirable examples, with its reference point) and ORPO
(reference-free odds-ratio loss added to SFT): the loss functions only.

Neither is in `PREFERENCE_LOSSES`: KTO's data are not pairs, and ORPO needs its own trainer
choices (no reference model, the NLL term). ``orpo`` has the pair-loss signature, so a trainer
can register it (``PREFERENCE_LOSSES.register("orpo")(orpo)``) as it is.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from lmpo.algos.preference import _check_pair, _figures, _per_token, _require

# ORPO takes log(1 - p) of an average probability p; p = 1 exactly (average log-prob 0) would be
# log 0. Average log-probs are capped just below 0 so the odds stay finite.
ORPO_MAX_AVG_LOGP = -1e-12


def kto_reference_point(policy_kl_logps: Tensor, ref_kl_logps: Tensor) -> Tensor:
    """KTO's reference point ``z0 = max(0, mean_j (pi(y'_j|x_j) - ref(y'_j|x_j)))``, detached.

    An estimate of KL(pi || pi_ref) from completions ``y'_j`` that do NOT belong to prompt ``x_j``
    (TRL pairs each prompt with another example's answer), summed log-probs [M] each; the mean is
    over this batch (TRL averages it over all processes as well). Ethayarajh et al. 2024.
    """
    if policy_kl_logps.shape != ref_kl_logps.shape or policy_kl_logps.dim() != 1:
        raise ValueError(f"KL log-probs must be two [M] tensors, got {tuple(policy_kl_logps.shape)} and "
                         f"{tuple(ref_kl_logps.shape)}")
    if policy_kl_logps.numel() == 0:
        return policy_kl_logps.new_zeros(())
    return (policy_kl_logps - ref_kl_logps).detach().mean().clamp_min(0.0)


def kto(
    policy_logps: Tensor,
    ref_logps: Tensor,
    desirable: Tensor,
    z0: Tensor | float,
    *,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """KTO (Ethayarajh et al. 2024, "KTO: Model Alignment as Prospect Theoretic Optimization",
    arXiv:2402.01306), as in TRL's ``KTOTrainer`` (sigmoid loss).

    Per example i with implicit reward ``r_i = beta*(pi_i - ref_i)`` (summed log-probs [N]) and the
    reference point ``z0`` (a constant, see `kto_reference_point`):
    desirable ``loss_i = lambda_D * (1 - sigma(r_i - beta*z0))``, undesirable
    ``loss_i = lambda_U * (1 - sigma(beta*z0 - r_i))``; ``desirable`` is a bool [N],
    ``lambda_D = desirable_weight``, ``lambda_U = undesirable_weight`` (the paper suggests
    ``lambda_D*n_D / (lambda_U*n_U)`` in [1, 4/3]). The mean over all N examples is the batch loss.
    Figures [N], detached: ``reward`` (r_i), ``desirable`` (0/1), ``z0``.
    """
    if policy_logps.dim() != 1:
        raise ValueError(f"policy_logps must be 1-D [N], got shape {tuple(policy_logps.shape)}")
    for name, t in (("ref_logps", ref_logps), ("desirable", desirable)):
        if t.shape != policy_logps.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != policy_logps {tuple(policy_logps.shape)}")
    if desirable.dtype != torch.bool:
        raise ValueError(f"desirable must be a bool tensor, got {desirable.dtype}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if desirable_weight < 0 or undesirable_weight < 0:
        raise ValueError(f"weights must be >= 0, got {desirable_weight}, {undesirable_weight}")
    z0 = torch.as_tensor(z0, dtype=policy_logps.dtype, device=policy_logps.device).detach()
    if z0.numel() != 1:
        raise ValueError(f"z0 must be a scalar, got shape {tuple(z0.shape)}")
    reward = beta * (policy_logps - ref_logps.detach())
    shift = beta * z0.reshape(())
    loss = torch.where(desirable, desirable_weight * (1.0 - torch.sigmoid(reward - shift)),
                       undesirable_weight * (1.0 - torch.sigmoid(shift - reward)))
    return loss, {"reward": reward.detach(), "desirable": desirable.to(reward.dtype),
                  "z0": shift.expand_as(reward) / beta}


def _log1mexp(a: Tensor) -> Tensor:
    """``log(1 - exp(a))`` for ``a < 0``, accurate on both sides of ``-log 2``."""
    return torch.where(a > -math.log(2.0), torch.log(-torch.expm1(a)), torch.log1p(-torch.exp(a)))


def odds_ratio_loss(chosen_avg_logps: Tensor, rejected_avg_logps: Tensor) -> tuple[Tensor, Tensor]:
    """ORPO's odds-ratio term from AVERAGE (per-token) log-probs [B]: ``(loss, log_odds_ratio)``.

    ``log odds(y) = log p - log(1 - p)`` with ``log p`` the average log-prob;
    ``log_odds_ratio = log odds(y_w) - log odds(y_l)``, ``loss = -log sigma(log_odds_ratio)``.
    Average log-probs are capped at -1e-12 (p < 1), so the odds are finite.
    """
    if chosen_avg_logps.shape != rejected_avg_logps.shape:
        raise ValueError(f"shapes differ: {tuple(chosen_avg_logps.shape)} and {tuple(rejected_avg_logps.shape)}")
    a_w = chosen_avg_logps.clamp(max=ORPO_MAX_AVG_LOGP)
    a_l = rejected_avg_logps.clamp(max=ORPO_MAX_AVG_LOGP)
    log_odds = (a_w - a_l) - (_log1mexp(a_w) - _log1mexp(a_l))
    return -F.logsigmoid(log_odds), log_odds


def orpo(chosen_logps: Tensor, rejected_logps: Tensor, ref_chosen_logps: Tensor | None = None,
         ref_rejected_logps: Tensor | None = None, *, beta: float = 0.1, chosen_lengths: Tensor | None = None,
         rejected_lengths: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """ORPO (Hong, Lee & Thorne 2024, "ORPO: Monolithic Preference Optimization without Reference
    Model", arXiv:2403.07691), per pair.

    ``loss = -pi_w/|y_w| + beta * (-log sigma(log odds(y_w) - log odds(y_l)))``: the chosen
    answer's per-token NLL (SFT) plus the odds-ratio term of `odds_ratio_loss` on average
    log-probs; ``beta`` is the paper's lambda (TRL's ``beta``, 0.1). Reference-free (references
    ignored); lengths are required. TRL's NLL is the mean over all chosen tokens of the batch,
    this one each pair's own mean. Figures: rewards ``beta*pi/|y|`` (as TRL's), margin, accuracy,
    ``log_odds_ratio`` and ``nll``.
    """
    lengths = {"chosen_lengths": chosen_lengths, "rejected_lengths": rejected_lengths}
    _check_pair(chosen_logps, rejected_logps, beta, **lengths)
    _require("orpo", **lengths)
    avg_w, avg_l = _per_token(chosen_logps, chosen_lengths), _per_token(rejected_logps, rejected_lengths)
    ratio_loss, log_odds = odds_ratio_loss(avg_w, avg_l)
    nll = -avg_w
    figures = _figures(beta * avg_w, beta * avg_l)
    figures.update(log_odds_ratio=log_odds.detach(), nll=nll.detach())
    return nll + beta * ratio_loss, figures


orpo.reference_free = True
