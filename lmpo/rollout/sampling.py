"""Choosing the next token from logits: temperature, top-k, top-p, greedy."""

from __future__ import annotations

import torch

from lmpo.rollout.types import SamplingParams


def sample_next(logits: torch.Tensor, params: SamplingParams,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of `logits` [B, V]; return (tokens [B], behaviour log-probs [B]).

    The log-prob is that of the temperature-scaled full distribution (temperature 1 for
    greedy), which is what the trainer recomputes from the policy; top-k/top-p only decide
    which tokens may be drawn.
    """
    logits = logits.float()
    scaled = logits / params.temperature if not params.greedy else logits
    logp = torch.log_softmax(scaled, dim=-1)
    if params.greedy:
        tokens = logp.argmax(dim=-1)
    else:
        filtered = _filter_top_k_top_p(scaled, params.top_k, params.top_p)
        probs = torch.softmax(filtered, dim=-1)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)


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
