"""Pairwise reward-model loss and reading a sequence's score at its last real token."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def bradley_terry_loss(
    chosen_scores: Tensor,
    rejected_scores: Tensor,
    *,
    margin: Tensor | float = 0.0,
    center_coef: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Bradley-Terry pairwise loss, per pair [B] (as in InstructGPT, Ouyang et al. 2022,
    arXiv:2203.02155), with an optional margin (Llama 2, Touvron et al. 2023,
    arXiv:2307.09288) and centering term (Eisenstein et al. 2023, arXiv:2312.09244).

    ``loss = -log sigma(r_w - r_l - m) + c*(r_w + r_l)^2``. ``margin`` m (a float or a
    per-pair [B] tensor, treated as a constant) demands that r_w beat r_l by at least about
    m; ``center_coef`` c >= 0 pulls the pair's scores toward a zero mean, which BT alone
    leaves undetermined (Eisenstein et al. use c = 0.01).
    Figures (detached, [B]): ``margin`` = ``r_w - r_l`` (without m) and ``accuracy`` = 1.0
    where ``r_w > r_l`` strictly, else 0.0.
    """
    if chosen_scores.dim() != 1:
        raise ValueError(f"chosen_scores must be 1-D [B], got shape {tuple(chosen_scores.shape)}")
    if rejected_scores.shape != chosen_scores.shape:
        raise ValueError(
            f"rejected_scores shape {tuple(rejected_scores.shape)} != chosen_scores "
            f"{tuple(chosen_scores.shape)}"
        )
    if isinstance(margin, Tensor):
        margin = margin.detach()
        if margin.dim() > 0 and margin.shape != chosen_scores.shape:
            raise ValueError(
                f"margin shape {tuple(margin.shape)} != chosen_scores {tuple(chosen_scores.shape)}"
            )
    if not center_coef >= 0:
        raise ValueError(f"center_coef must be >= 0, got {center_coef}")
    diff = chosen_scores - rejected_scores
    loss = -F.logsigmoid(diff - margin)
    if center_coef:
        loss = loss + center_coef * (chosen_scores + rejected_scores).square()
    diff = diff.detach()
    return loss, {"margin": diff, "accuracy": (diff > 0).to(diff.dtype)}


def last_token_index(attention_mask: Tensor) -> Tensor:
    """Index [B] (int64) of the last nonzero position of each row of ``attention_mask`` [B,T].

    Works for right padding (``length - 1``), left padding (``T - 1``) and no padding alike.
    A row of all padding gets index 0 (a valid position to gather from; its value is
    meaningless and the caller should drop or mask that row).
    """
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be [B, T], got shape {tuple(attention_mask.shape)}")
    if attention_mask.shape[1] == 0:
        raise ValueError("attention_mask has no positions (T = 0)")
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    # max over positions of real tokens; padding counts as -1, so an all-padding row gives 0.
    return torch.where(attention_mask != 0, positions, -1).amax(dim=1).clamp_min(0)


def gather_last(values: Tensor, attention_mask: Tensor) -> Tensor:
    """``values[b, last_token_index(attention_mask)[b]]`` [B]: e.g. a reward head's score,
    read at each sequence's last real token. ``values`` [B,T] has the mask's shape.
    """
    if values.shape != attention_mask.shape:
        raise ValueError(
            f"values shape {tuple(values.shape)} != attention_mask {tuple(attention_mask.shape)}"
        )
    return values.gather(1, last_token_index(attention_mask).unsqueeze(1)).squeeze(1)
