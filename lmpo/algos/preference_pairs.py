"""More pairwise preference losses (as in TRL's ``DPOTrainer`` ``loss_type`` list): robust,
hinge, exo_pair, nca_pair, bco_pair, sppo_hard, and ``sft`` (the NLL of the chosen answer,
for weighted sums such as MPO's).

Same signature and conventions as `lmpo.algos.preference` (summed log-probs [B] in, per-pair
loss [B] and detached per-pair figures out). Notation: ``u_w = pi_w - ref_w`` and
``u_l = pi_l - ref_l`` (log-ratios to the reference), ``h = beta*(u_w - u_l)`` (DPO's
logit), sigma = sigmoid; the figures' implicit rewards are ``beta*u_w`` and ``beta*u_l``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from lmpo.algos.preference import (PREFERENCE_LOSSES, _check_pair, _figures, _implicit_rewards, _per_token,
                                   _require)


def _rewards(name: str, chosen: Tensor, rejected: Tensor, ref_chosen: Tensor | None,
             ref_rejected: Tensor | None, beta: float) -> tuple[Tensor, Tensor]:
    """Checked inputs -> ``(beta*u_w, beta*u_l)``; the reference log-probs are required."""
    refs = {"ref_chosen_logps": ref_chosen, "ref_rejected_logps": ref_rejected}
    _check_pair(chosen, rejected, beta, **refs)
    _require(name, **refs)
    return _implicit_rewards(chosen, rejected, ref_chosen, ref_rejected, beta)


@PREFERENCE_LOSSES.register("robust")
def robust(chosen_logps: Tensor, rejected_logps: Tensor, ref_chosen_logps: Tensor | None,
           ref_rejected_logps: Tensor | None, *, beta: float = 0.1, chosen_lengths: Tensor | None = None,
           rejected_lengths: Tensor | None = None, label_smoothing: float = 0.1) -> tuple[Tensor, dict[str, Tensor]]:
    """Robust DPO (Chowdhury, Kini & Natarajan 2024, "Provably Robust DPO", arXiv:2403.00409).

    ``loss = [-(1-eps)*log sigma(h) + eps*log sigma(-h)] / (1 - 2*eps)``, ``eps = label_smoothing``
    in [0, 0.5), the assumed rate of flipped labels: an unbiased estimate of the clean-label DPO
    loss under that noise (cDPO adds the flipped term instead of subtracting it). ``eps = 0`` is DPO.
    """
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    cr, rr = _rewards("robust", chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)
    h = cr - rr
    eps = label_smoothing
    loss = (-(1.0 - eps) * F.logsigmoid(h) + eps * F.logsigmoid(-h)) / (1.0 - 2.0 * eps)
    return loss, _figures(cr, rr)


@PREFERENCE_LOSSES.register("hinge")
def hinge(chosen_logps: Tensor, rejected_logps: Tensor, ref_chosen_logps: Tensor | None,
          ref_rejected_logps: Tensor | None, *, beta: float = 0.1, chosen_lengths: Tensor | None = None,
          rejected_lengths: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """Hinge loss of SLiC (Zhao et al. 2023, "SLiC-HF: Sequence Likelihood Calibration with Human
    Feedback", arXiv:2305.10425), on reference-normalised log-probs as in TRL and RSO (Liu et al.
    2023, arXiv:2309.06657).

    ``loss = max(0, 1 - h)``: zero once the margin ``h`` reaches 1; ``1/beta`` is SLiC's
    margin delta in log-ratio units.
    """
    cr, rr = _rewards("hinge", chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)
    return torch.relu(1.0 - (cr - rr)), _figures(cr, rr)


@PREFERENCE_LOSSES.register("exo_pair")
def exo_pair(chosen_logps: Tensor, rejected_logps: Tensor, ref_chosen_logps: Tensor | None,
             ref_rejected_logps: Tensor | None, *, beta: float = 0.1, chosen_lengths: Tensor | None = None,
             rejected_lengths: Tensor | None = None, label_smoothing: float = 1e-3) -> tuple[Tensor, dict[str, Tensor]]:
    """EXO, pairwise (Ji et al. 2024, "Towards Efficient Exact Optimization of Language Model
    Alignment", arXiv:2402.00856).

    ``loss = sigma(h)*(log sigma(h) - log(1-eps)) + sigma(-h)*(log sigma(-h) - log eps)``: the
    reverse KL from the policy's pair distribution ``(sigma(h), sigma(-h))`` to the smoothed
    label ``(1-eps, eps)``, minimised at ``h = log((1-eps)/eps)``. ``eps = label_smoothing`` must
    be in (0, 1); TRL uses 1e-3 when its label_smoothing is 0.
    """
    if not 0.0 < label_smoothing < 1.0:
        raise ValueError(f"exo_pair needs label_smoothing in (0, 1), got {label_smoothing}")
    cr, rr = _rewards("exo_pair", chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)
    h = cr - rr
    eps = label_smoothing
    loss = torch.sigmoid(h) * (F.logsigmoid(h) - math.log1p(-eps)) + torch.sigmoid(-h) * (
        F.logsigmoid(-h) - math.log(eps))
    return loss, _figures(cr, rr)


@PREFERENCE_LOSSES.register("nca_pair")
def nca_pair(chosen_logps: Tensor, rejected_logps: Tensor, ref_chosen_logps: Tensor | None,
             ref_rejected_logps: Tensor | None, *, beta: float = 0.1, chosen_lengths: Tensor | None = None,
             rejected_lengths: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """NCA, pairwise (Chen et al. 2024, "Noise Contrastive Alignment of Language Models with
    Explicit Rewards", arXiv:2402.05369).

    ``loss = -log sigma(beta*u_w) - 0.5*log sigma(-beta*u_w) - 0.5*log sigma(-beta*u_l)``: each
    answer's absolute reward is scored, not only their difference, so the chosen likelihood is not
    pushed down along with the rejected one.
    """
    cr, rr = _rewards("nca_pair", chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)
    loss = -F.logsigmoid(cr) - 0.5 * F.logsigmoid(-cr) - 0.5 * F.logsigmoid(-rr)
    return loss, _figures(cr, rr)


@PREFERENCE_LOSSES.register("bco_pair")
def bco_pair(chosen_logps: Tensor, rejected_logps: Tensor, ref_chosen_logps: Tensor | None,
             ref_rejected_logps: Tensor | None, *, beta: float = 0.1, chosen_lengths: Tensor | None = None,
             rejected_lengths: Tensor | None = None, delta: Tensor | float | None = None
             ) -> tuple[Tensor, dict[str, Tensor]]:
    """BCO, pairwise (Jung et al. 2024, "Binary Classifier Optimization for Large Language Model
    Alignment", arXiv:2404.04656).

    ``loss = -log sigma(beta*u_w - delta) - log sigma(-(beta*u_l - delta))``: a binary classifier
    of chosen vs rejected with the implicit reward as logit, shifted by ``delta``, a constant.
    ``delta=None`` (what the trainer passes) is this batch's mean of the 2B implicit rewards
    ``beta*u``, detached; TRL keeps a running mean over all batches seen (its first batch's value
    is this one). Pass a tensor or a number to use another shift.
    """
    cr, rr = _rewards("bco_pair", chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)
    if delta is None:
        delta = torch.cat((cr, rr)).detach().mean()
    elif isinstance(delta, Tensor):
        delta = delta.detach()
    loss = -F.logsigmoid(cr - delta) - F.logsigmoid(-(rr - delta))
    return loss, _figures(cr, rr)


@PREFERENCE_LOSSES.register("sppo_hard")
def sppo_hard(chosen_logps: Tensor, rejected_logps: Tensor, ref_chosen_logps: Tensor | None,
              ref_rejected_logps: Tensor | None, *, beta: float = 0.1, chosen_lengths: Tensor | None = None,
              rejected_lengths: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """SPPO with hard labels (Wu et al. 2024, "Self-Play Preference Optimization for Language
    Model Alignment", arXiv:2405.00675), as in TRL.

    ``loss = (u_w - 1/(2*beta))^2 + (u_l + 1/(2*beta))^2``: the winner's log-ratio is pulled to
    ``+1/(2 beta)`` and the loser's to ``-1/(2 beta)`` (the paper's win probabilities 1 and 0,
    scaled by ``eta = 1/beta``), each answer on its own.
    """
    cr, rr = _rewards("sppo_hard", chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)
    u_w, u_l = chosen_logps - ref_chosen_logps.detach(), rejected_logps - ref_rejected_logps.detach()
    target = 1.0 / (2.0 * beta)
    return (u_w - target).square() + (u_l + target).square(), _figures(cr, rr)


@PREFERENCE_LOSSES.register("sft")
def sft(chosen_logps: Tensor, rejected_logps: Tensor, ref_chosen_logps: Tensor | None,
        ref_rejected_logps: Tensor | None, *, beta: float = 0.1, chosen_lengths: Tensor | None = None,
        rejected_lengths: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """Negative log-likelihood of the chosen answer per token, ``loss = -pi_w/|y_w|``: the SFT term
    of weighted sums such as MPO's ``dpo=0.8,bco_pair=0.2,sft=1`` (Wang et al. 2024, "Enhancing the
    Reasoning Ability of Multimodal Large Language Models via Mixed Preference Optimization",
    arXiv:2411.10442). Reference-free; lengths are required.

    Each pair's mean over its own tokens, then (by the trainer) the mean over pairs; TRL's ``sft``
    loss type is the mean over all chosen tokens of the batch (long answers weigh more). The
    figures' rewards are ``beta*pi/|y|`` (as SimPO's).
    """
    lengths = {"chosen_lengths": chosen_lengths, "rejected_lengths": rejected_lengths}
    _check_pair(chosen_logps, rejected_logps, beta, **lengths)
    _require("sft", **lengths)
    chosen_avg = _per_token(chosen_logps, chosen_lengths)
    return -chosen_avg, _figures(beta * chosen_avg, beta * _per_token(rejected_logps, rejected_lengths))


sft.reference_free = True
