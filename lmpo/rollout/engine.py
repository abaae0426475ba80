"""Batched sampling with a KV cache for any transformers causal LM."""

from __future__ import annotations

from typing import Literal, Sequence

import torch
from transformers import PreTrainedModel

from lmpo.models.logprobs import context_length
from lmpo.models.padding import left_pad
from lmpo.rollout.decoders import FastLlamaDecoder, HFDecoder, fast_path_refusal
from lmpo.rollout.sampling import sample_next
from lmpo.rollout.types import FINISH_EOS, FINISH_LENGTH, Rollout, SamplingParams

Backend = Literal["auto", "fast", "hf"]
COMPACT_BELOW = 0.75  # drop finished rows from the decoder once a quarter of them are done


BACKENDS = ("auto", "fast", "hf")


def make_decoder(model: PreTrainedModel, backend: Backend = "auto") -> HFDecoder | FastLlamaDecoder:
    """The incremental decoder for `model`: ``"fast"`` the lean Llama-family decoder (refused, with
    the reason, for a model it does not implement exactly), ``"hf"`` the model's own forward with a
    KV cache, ``"auto"`` the fast one where it applies, else the HF one."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "hf":
        return HFDecoder(model)
    refusal = fast_path_refusal(model)
    if not refusal:
        return FastLlamaDecoder(model)
    if backend == "fast":
        raise ValueError(f"the fast decoder does not implement this {type(model).__name__} exactly ({refusal}); "
                         "use backend='hf'")
    return HFDecoder(model)


def generate(model: PreTrainedModel, prompts: Sequence[Sequence[int]], params: SamplingParams, *,
             eos_id: int | Sequence[int], pad_id: int, generator: torch.Generator | None = None,
             backend: Backend = "auto", caps: Sequence[int] | None = None) -> Rollout:
    """Sample one completion per prompt (repeat a prompt G times for a group).

    Stops a sequence at its first EOS token (kept, with loss mask 1, so the policy learns to
    stop) or after `params.max_new_tokens` tokens. Refuses token ids outside the model's
    vocabulary and a prompt that, with its new tokens, does not fit the model's context:
    `caps[i]` (default `params.max_new_tokens`) is how many of prompt i's new tokens the caller
    keeps (`LocalEngine.generate` cuts each row at its own cap), so only those need to fit.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    input_ids, attention_mask = left_pad(prompts, pad_id)
    _check_fits(model, prompts, input_ids[attention_mask.bool()],
                [params.max_new_tokens] * len(prompts) if caps is None else caps)
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        eos = torch.tensor([eos_id] if isinstance(eos_id, int) else list(eos_id), device=device)
        # inference mode skips autograd bookkeeping on every small op of the decoding loop
        with torch.inference_mode():
            tokens, logprobs = _decode(make_decoder(model, backend), input_ids, attention_mask, params, eos,
                                       pad_id, generator)
        # leave inference mode with ordinary tensors that the trainer may use in autograd
        tokens, logprobs = tokens.clone(), logprobs.clone()
    finally:
        model.train(was_training)
    ended_with_eos = torch.isin(tokens, eos).any(dim=1).tolist()
    loss_mask = _mask_through_first_eos(tokens, eos)
    return Rollout(
        prompt_ids=[list(p) for p in prompts],
        completion_ids=torch.where(loss_mask.bool(), tokens, torch.full_like(tokens, pad_id)).cpu(),
        loss_mask=loss_mask.cpu(),
        logprobs=torch.where(loss_mask.bool(), logprobs, torch.zeros_like(logprobs)).cpu(),
        finish_reasons=[FINISH_EOS if e else FINISH_LENGTH for e in ended_with_eos],
        pad_id=pad_id,
        lengths=loss_mask.sum(dim=1).long().cpu(),
    )


def _check_fits(model: PreTrainedModel, prompts: Sequence[Sequence[int]], tokens: torch.Tensor,
                caps: Sequence[int]) -> None:
    """Refuse prompt token ids (`tokens`, flat, on the CPU) outside the vocabulary, and a prompt
    whose length plus its cap of new tokens exceeds the model's context."""
    vocab = model.get_input_embeddings().num_embeddings
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= vocab:
        raise ValueError(f"prompt token ids must be in [0, {vocab}) (the model's vocabulary), got ids from {low} to {high}")
    context = context_length(model)
    if context is None:
        return
    if len(caps) != len(prompts):
        raise ValueError(f"caps has {len(caps)} entries for {len(prompts)} prompts")
    longest = max(range(len(prompts)), key=lambda i: len(prompts[i]) + caps[i])
    if len(prompts[longest]) + caps[longest] > context:
        raise ValueError(f"prompt {longest} has {len(prompts[longest])} tokens and may get {caps[longest]} new ones "
                         f"(max_new_tokens), {len(prompts[longest]) + caps[longest]} in all: more than the model's "
                         f"context of {context} tokens")


def _decode(decoder, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams,
            eos: torch.Tensor, pad_id: int, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampling loop: returns tokens and behaviour log-probs [B, steps taken]."""
    batch, steps, device = input_ids.size(0), params.max_new_tokens, input_ids.device
    tokens_out = torch.full((batch, steps), pad_id, dtype=torch.long, device=device)
    logprobs_out = torch.zeros((batch, steps), dtype=torch.float32, device=device)
    rows = torch.arange(batch, device=device)  # decoder row -> output row
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    logits = _prefill_distinct(decoder, input_ids, attention_mask, steps)
    for t in range(steps):
        tokens, logprobs = sample_next(logits, params, generator)
        # rows that ended but are not yet compacted away also get a token here: everything after a
        # row's first EOS is masked out by the caller, so they need no masking in the loop
        tokens_out[rows, t] = tokens
        logprobs_out[rows, t] = logprobs
        alive = alive & ~torch.isin(tokens, eos)
        n_alive = int(alive.sum())
        if t + 1 == steps or n_alive == 0:
            break
        if n_alive <= COMPACT_BELOW * len(rows):
            # stop spending compute on finished sequences
            keep = alive.nonzero().squeeze(1)
            decoder.keep(keep)
            rows, tokens, alive = rows[keep], tokens[keep], alive[keep]
        logits = decoder.step(tokens)
    return tokens_out[:, : t + 1], logprobs_out[:, : t + 1]


def _prefill_distinct(decoder, input_ids: torch.Tensor, attention_mask: torch.Tensor, steps: int) -> torch.Tensor:
    """The decoder's prefill, run once per distinct prompt (a GRPO group repeats each one), its
    cache then copied to every row that shares it: next-token logits [B, V]."""
    rows = torch.cat([input_ids, attention_mask.to(input_ids.dtype)], dim=1)
    distinct, inverse = torch.unique(rows, dim=0, return_inverse=True)
    if len(distinct) == len(rows):
        return decoder.prefill(input_ids, attention_mask, steps)
    first = torch.full((len(distinct),), len(rows), dtype=torch.long, device=rows.device)
    first = first.scatter_reduce(0, inverse, torch.arange(len(rows), device=rows.device), "amin")
    logits = decoder.prefill(input_ids[first], attention_mask[first], steps)
    decoder.keep(inverse)
    return logits[inverse]


def _mask_through_first_eos(tokens: torch.Tensor, eos: torch.Tensor) -> torch.Tensor:
    is_eos = torch.isin(tokens, eos).long()
    eos_before = is_eos.cumsum(dim=1) - is_eos  # EOS tokens strictly before this position
    return (eos_before == 0).float()
