"""Choosing the next token from logits: temperature, top-k, top-p, greedy."""

from __future__ import annotations

import torch

from lmpo.rollout import kernels
from lmpo.rollout.types import SamplingParams


def sample_next(logits: torch.Tensor, params: SamplingParams,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of `logits` [B, V]; return (tokens [B], behaviour log-probs [B]).

    The log-prob is that of the temperature-scaled full distribution (temperature 1 for
    greedy), which is what the trainer recomputes from the policy; top-k/top-p only decide
    which tokens may be drawn.
    """
    logits = logits.float()
    kern = kernels.load() if logits.device.type == "cpu" and not (params.top_k or params.top_p < 1.0) else None
    if kern is not None:
        # one compiled call instead of a dozen small operations; the same uniform numbers are drawn
        uniform = None if params.greedy else torch.rand(logits.size(0), 1, generator=generator)
        return kern.sample_rows(logits.contiguous(), uniform, 1.0 if params.greedy else 1.0 / params.temperature)
    scaled = logits / params.temperature if not params.greedy else logits
    logp = torch.log_softmax(scaled, dim=-1)
    if params.greedy:
        tokens = logp.argmax(dim=-1)
    else:
        if params.top_k or params.top_p < 1.0:
            probs = torch.softmax(_filter_top_k_top_p(scaled, params.top_k, params.top_p), dim=-1)
        else:
            probs = logp.exp()
        tokens = _inverse_cdf_sample(probs, generator)
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)


def _inverse_cdf_sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row: the first token whose cumulative probability exceeds a uniform number.
    Exact, and needs one random number per row rather than one per vocabulary entry."""
    cdf = probs.cumsum(dim=-1)
    # drawn where the generator lives (the trainers' is a CPU one, so its state resumes anywhere)
    where = generator.device if generator is not None else probs.device
    u = torch.rand(probs.size(0), 1, generator=generator, device=where).to(probs.device) * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, u, right=True).squeeze(1)
    # guard the float edge u == cdf[-1]; and never pick a token of probability 0
    tokens = tokens.clamp(max=probs.size(-1) - 1)
    return torch.where(probs.gather(1, tokens[:, None]).squeeze(1) > 0, tokens, probs.argmax(dim=-1))


def _filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if top_k and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # drop a token when the mass before it already reaches top_p; the top token always stays
        drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits
