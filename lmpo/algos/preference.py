"""Offline preference-optimisation losses on pairs ``(x, y_w, y_l)``, one value per pair.

Every loss has the signature ``fn(chosen_logps, rejected_logps, ref_chosen_logps,
ref_rejected_logps, *, beta=0.1, chosen_lengths=None, rejected_lengths=None, **options)
-> (loss [B], figures)``. The log-probs are [B] SUMS of ``log pi(y_t | x, y_<t)`` over the
completion tokens (the caller masks prompt and padding and sums); ``*_lengths`` are the
[B] completion-token counts, needed only by the length-normalised losses (``ipo``,
``simpo``), which divide the sums by them (a length below 1 is treated as 1).
Reference log-probs are constants (detached); reference-free losses ignore them and carry the
attribute ``reference_free = True``. More losses: `preference_pairs`, `preference_anchored`;
weighted sums of them: `preference_mix`.

``figures`` maps names to detached per-pair [B] tensors, for logging: ``chosen_reward``
and ``rejected_reward`` (the implicit rewards), ``margin`` (chosen - rejected reward) and
``accuracy`` (1.0 where margin > 0, else 0.0). Notation: pi = policy log-prob, ref =
reference log-prob, w = chosen, l = rejected, sigma = sigmoid.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from lmpo.algos.preference_mix import PreferenceLossRegistry

# single losses by name; `get` also takes a weighted sum such as "dpo=0.8,bco_pair=0.2,sft=1"
PREFERENCE_LOSSES = PreferenceLossRegistry("preference loss")


def _check_pair(chosen: Tensor, rejected: Tensor, beta: float, **others: Tensor | None) -> None:
    if chosen.dim() != 1:
        raise ValueError(f"chosen_logps must be 1-D [B], got shape {tuple(chosen.shape)}")
    for name, t in (("rejected_logps", rejected), *others.items()):
        if t is not None and t.shape != chosen.shape:
            raise ValueError(f"{name} shape {tuple(t.shape)} != chosen_logps {tuple(chosen.shape)}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")


def _require(loss: str, **tensors: Tensor | None) -> None:
    missing = [name for name, t in tensors.items() if t is None]
    if missing:
        raise ValueError(f"{loss} needs {', '.join(missing)} (got None)")


def _per_token(logps: Tensor, lengths: Tensor) -> Tensor:
    """``logps / |y|``; lengths below 1 (empty completions, sum 0) count as 1, not as 0/0."""
    return logps / lengths.detach().to(logps.dtype).clamp_min(1.0)


def _figures(chosen_reward: Tensor, rejected_reward: Tensor) -> dict[str, Tensor]:
    chosen_reward, rejected_reward = chosen_reward.detach(), rejected_reward.detach()
    margin = chosen_reward - rejected_reward
    return {
        "chosen_reward": chosen_reward,
        "rejected_reward": rejected_reward,
        "margin": margin,
        "accuracy": (margin > 0).to(margin.dtype),
    }


def _implicit_rewards(
    chosen_logps: Tensor,
    rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float,
) -> tuple[Tensor, Tensor]:
    """``beta*(pi_w - ref_w)`` and ``beta*(pi_l - ref_l)``; their difference is DPO's h."""
    return (
        beta * (chosen_logps - ref_chosen_logps.detach()),
        beta * (rejected_logps - ref_rejected_logps.detach()),
    )


def _logistic(
    name: str,
    chosen_logps: Tensor,
    rejected_logps: Tensor,
    ref_chosen_logps: Tensor | None,
    ref_rejected_logps: Tensor | None,
    beta: float,
    label_smoothing: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPO / cDPO: ``-(1-eps)*logsigmoid(h) - eps*logsigmoid(-h)``."""
    refs = {"ref_chosen_logps": ref_chosen_logps, "ref_rejected_logps": ref_rejected_logps}
    _check_pair(chosen_logps, rejected_logps, beta, **refs)
    _require(name, **refs)
    chosen_reward, rejected_reward = _implicit_rewards(
        chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta
    )
    h = chosen_reward - rejected_reward
    loss = -F.logsigmoid(h)
    if label_smoothing:
        loss = (1.0 - label_smoothing) * loss - label_smoothing * F.logsigmoid(-h)
    return loss, _figures(chosen_reward, rejected_reward)


@PREFERENCE_LOSSES.register("dpo")
def dpo(
    chosen_logps: Tensor,
    rejected_logps: Tensor,
    ref_chosen_logps: Tensor | None,
    ref_rejected_logps: Tensor | None,
    *,
    beta: float = 0.1,
    chosen_lengths: Tensor | None = None,
    rejected_lengths: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPO (Rafailov et al. 2023, arXiv:2305.18290).

    ``h = beta*[(pi_w - ref_w) - (pi_l - ref_l)]``, ``loss = -log sigma(h)`` (computed as
    ``-logsigmoid(h)``, finite for any h). Lengths are accepted and ignored.
    """
    return _logistic(
        "dpo", chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta, 0.0
    )


@PREFERENCE_LOSSES.register("cdpo")
def cdpo(
    chosen_logps: Tensor,
    rejected_logps: Tensor,
    ref_chosen_logps: Tensor | None,
    ref_rejected_logps: Tensor | None,
    *,
    beta: float = 0.1,
    chosen_lengths: Tensor | None = None,
    rejected_lengths: Tensor | None = None,
    label_smoothing: float = 0.1,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Conservative DPO, i.e. DPO with label smoothing (Mitchell 2023, "A note on DPO with
    noisy preferences & relationship to IPO").

    ``loss = -(1-eps)*log sigma(h) - eps*log sigma(-h)`` with DPO's h and
    ``eps = label_smoothing``, the assumed probability that a pair's label is flipped; it must
    be in [0, 0.5). ``eps = 0`` is exactly ``dpo``; for ``eps > 0`` the loss is minimised at
    the finite ``h = log((1-eps)/eps)`` instead of pushing h to infinity.
    """
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    return _logistic(
        "cdpo", chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta,
        label_smoothing,
    )


@PREFERENCE_LOSSES.register("ipo")
def ipo(
    chosen_logps: Tensor,
    rejected_logps: Tensor,
    ref_chosen_logps: Tensor | None,
    ref_rejected_logps: Tensor | None,
    *,
    beta: float = 0.1,
    chosen_lengths: Tensor | None = None,
    rejected_lengths: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """IPO (Azar et al. 2023, "A General Theoretical Paradigm to Understand Learning from
    Human Preferences", arXiv:2310.12036), with token-averaged log-probs as in TRL.

    ``d = (pi_w - ref_w)/|y_w| - (pi_l - ref_l)/|y_l|`` (= h/beta on averaged log-probs),
    ``loss = (d - 1/(2*beta))^2``: a squared loss that pulls d to the finite target
    ``1/(2*beta)`` (beta is the paper's tau). Lengths are required.
    The figures' rewards are ``beta*(pi - ref)/|y|``, so ``margin = beta*d``.
    """
    needed = {
        "ref_chosen_logps": ref_chosen_logps,
        "ref_rejected_logps": ref_rejected_logps,
        "chosen_lengths": chosen_lengths,
        "rejected_lengths": rejected_lengths,
    }
    _check_pair(chosen_logps, rejected_logps, beta, **needed)
    _require("ipo", **needed)
    chosen_reward, rejected_reward = _implicit_rewards(
        _per_token(chosen_logps, chosen_lengths),
        _per_token(rejected_logps, rejected_lengths),
        _per_token(ref_chosen_logps, chosen_lengths),
        _per_token(ref_rejected_logps, rejected_lengths),
        beta,
    )
    d = (chosen_reward - rejected_reward) / beta
    loss = (d - 1.0 / (2.0 * beta)).square()
    return loss, _figures(chosen_reward, rejected_reward)


@PREFERENCE_LOSSES.register("simpo")
def simpo(
    chosen_logps: Tensor,
    rejected_logps: Tensor,
    ref_chosen_logps: Tensor | None,
    ref_rejected_logps: Tensor | None,
    *,
    beta: float = 0.1,
    chosen_lengths: Tensor | None = None,
    rejected_lengths: Tensor | None = None,
    gamma: float = 0.5,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SimPO, reference-free (Meng, Xia & Chen 2024, arXiv:2405.14734).

    ``loss = -log sigma(beta*(pi_w/|y_w| - pi_l/|y_l|) - gamma)``; the implicit reward is
    ``beta*pi/|y|``. Reference log-probs are ignored (may be None); lengths are required.

    ``gamma`` is the target reward margin, in reward units (after the beta scaling), as in
    TRL's ``simpo_gamma`` and torchtune: pairs are pushed until the chosen reward exceeds the
    rejected one by about gamma. The SimPO repo's configs give ``gamma_beta_ratio`` = gamma/beta
    instead (a margin in average log-prob per token); convert with ``gamma = ratio * beta``.
    The preprint uses beta of 2-2.5 (the repo later suggests up to 10) and the repo suggests
    searching gamma/beta over 0.25-0.4. The shared default ``beta=0.1`` is a DPO value: with it, gamma=0.5 asks
    for a 5-nat per-token gap, so pass beta explicitly for simpo.
    """
    lengths = {"chosen_lengths": chosen_lengths, "rejected_lengths": rejected_lengths}
    _check_pair(chosen_logps, rejected_logps, beta, **lengths)
    _require("simpo", **lengths)
    chosen_reward = beta * _per_token(chosen_logps, chosen_lengths)
    rejected_reward = beta * _per_token(rejected_logps, rejected_lengths)
    loss = -F.logsigmoid(chosen_reward - rejected_reward - gamma)
    return loss, _figures(chosen_reward, rejected_reward)


simpo.reference_free = True  # the trainer holds no reference model for it
