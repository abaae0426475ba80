"""Preference losses of TRL's list that look beyond one pair's difference: AOT (distributional,
paired and unpaired), APO (anchored: zero and down) and DiscoPOP.

Same signature and conventions as `lmpo.algos.preference`; notation ``u_w = pi_w - ref_w``,
``u_l = pi_l - ref_l``, ``h = beta*(u_w - u_l)``, sigma = sigmoid. The AOT losses compare
sorted batches, so their k-th value belongs to the k-th order statistic, not to pair k; their
figures stay per pair.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lmpo.algos.preference import PREFERENCE_LOSSES, _figures
from lmpo.algos.preference_pairs import _rewards


def _smoothed_logistic(delta: Tensor, label_smoothing: float) -> Tensor:
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    return -(1.0 - label_smoothing) * F.logsigmoid(delta) - label_smoothing * F.logsigmoid(-delta)


@PREFERENCE_LOSSES.register("aot")
def aot(chosen_logps: Tensor, rejected_logps: Tensor, ref_chosen_logps: Tensor | None,
        ref_rejected_logps: Tensor | None, *, beta: float = 0.1, chosen_lengths: Tensor | None = None,
        rejected_lengths: Tensor | None = None, label_smoothing: float = 0.0) -> tuple[Tensor, dict[str, Tensor]]:
    """AOT for paired data (Melnyk et al. 2024, "Distributional Preference Alignment of LLMs via
    Optimal Transport", arXiv:2406.05882), TRL's ``aot``.

    With ``a = sort_B(pi_w - pi_l)`` and ``b = sort_B(ref_w - ref_l)`` (ascending over the batch),
    ``delta_k = a_k - b_k`` and ``loss_k = -(1-eps)*log sigma(beta*delta_k) - eps*log
    sigma(-beta*delta_k)``: the policy's margins must dominate the reference's in the first order
    (quantile by quantile), not pair by pair. ``eps = label_smoothing`` in [0, 0.5).
    """
    cr, rr = _rewards("aot", chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)
    policy_margin, _ = torch.sort(chosen_logps - rejected_logps, dim=0)
    ref_margin, _ = torch.sort((ref_chosen_logps - ref_rejected_logps).detach(), dim=0)
    return _smoothed_logistic(beta * (policy_margin - ref_margin), label_smoothing), _figures(cr, rr)


@PREFERENCE_LOSSES.register("aot_pair")
def aot_pair(chosen_logps: Tensor, rejected_logps: Tensor, ref_chosen_logps: Tensor | None,
             ref_rejected_logps: Tensor | None, *, beta: float = 0.1, chosen_lengths: Tensor | None = None,
             rejected_lengths: Tensor | None = None, label_smoothing: float = 0.0
             ) -> tuple[Tensor, dict[str, Tensor]]:
    """AOT for unpaired data (Melnyk et al. 2024, arXiv:2406.05882), under TRL's name ``aot_pair``
    (despite the name, it is the variant that ignores the pairing).

    ``delta_k = sort_B(u_w)_k - sort_B(u_l)_k`` (chosen and rejected log-ratios sorted apart),
    ``loss_k = -(1-eps)*log sigma(beta*delta_k) - eps*log sigma(-beta*delta_k)``: the distribution
    of chosen rewards must dominate that of rejected ones. ``eps = label_smoothing`` in [0, 0.5).
    """
    cr, rr = _rewards("aot_pair", chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)
    chosen_sorted, _ = torch.sort(chosen_logps - ref_chosen_logps.detach(), dim=0)
    rejected_sorted, _ = torch.sort(rejected_logps - ref_rejected_logps.detach(), dim=0)
    return _smoothed_logistic(beta * (chosen_sorted - rejected_sorted), label_smoothing), _figures(cr, rr)


@PREFERENCE_LOSSES.register("apo_zero")
def apo_zero(chosen_logps: Tensor, rejected_logps: Tensor, ref_chosen_logps: Tensor | None,
             ref_rejected_logps: Tensor | None, *, beta: float = 0.1, chosen_lengths: Tensor | None = None,
             rejected_lengths: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """APO-zero (D'Oosterlinck et al. 2024, "Anchored Preference Optimization and Contrastive
    Revisions", arXiv:2408.06266).

    ``loss = (1 - sigma(beta*u_w)) + sigma(beta*u_l)``: raises the chosen likelihood and lowers the
    rejected one, each anchored to the reference; for answers better than the model's own.
    """
    cr, rr = _rewards("apo_zero", chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)
    return (1.0 - torch.sigmoid(cr)) + torch.sigmoid(rr), _figures(cr, rr)


@PREFERENCE_LOSSES.register("apo_down")
def apo_down(chosen_logps: Tensor, rejected_logps: Tensor, ref_chosen_logps: Tensor | None,
             ref_rejected_logps: Tensor | None, *, beta: float = 0.1, chosen_lengths: Tensor | None = None,
             rejected_lengths: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """APO-down (D'Oosterlinck et al. 2024, arXiv:2408.06266).

    ``loss = sigma(beta*u_w) + (1 - sigma(beta*(u_w - u_l)))``: lowers the chosen likelihood while
    widening the chosen-rejected gap; for answers worse than the model's own.
    """
    cr, rr = _rewards("apo_down", chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)
    return torch.sigmoid(cr) + (1.0 - torch.sigmoid(cr - rr)), _figures(cr, rr)


@PREFERENCE_LOSSES.register("discopop")
def discopop(chosen_logps: Tensor, rejected_logps: Tensor, ref_chosen_logps: Tensor | None,
             ref_rejected_logps: Tensor | None, *, beta: float = 0.1, chosen_lengths: Tensor | None = None,
             rejected_lengths: Tensor | None = None, discopop_tau: float = 0.05) -> tuple[Tensor, dict[str, Tensor]]:
    """DiscoPOP, the log-ratio modulated loss (Chris Lu et al. 2024, "Discovering Preference
    Optimization Algorithms with and for Large Language Models", arXiv:2406.08414).

    ``m = sigma(h/tau)``, ``loss = (1-m)*(-log sigma(h)) + m*exp(-h)``: a blend of the logistic
    (DPO) and exponential losses, switched by the sign of the margin; ``tau = discopop_tau`` > 0
    (0.05 in the paper and TRL). ``m*exp(-h)`` is computed as ``exp(log sigma(h/tau) - h)``, finite
    for any h when tau < 1.
    """
    if not discopop_tau > 0:
        raise ValueError(f"discopop_tau must be > 0, got {discopop_tau}")
    cr, rr = _rewards("discopop", chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)
    h = cr - rr
    m = torch.sigmoid(h / discopop_tau)
    loss = (1.0 - m) * -F.logsigmoid(h) + torch.exp(F.logsigmoid(h / discopop_tau) - h)
    return loss, _figures(cr, rr)
