"""Per-token log-probs of completions under a causal LM, in fp32.

Only the completion positions go through the output head (`logits_to_keep`), so no logits
are materialised for prompt tokens. With `chunk_tokens > 0` the head runs over the completion
tokens a chunk at a time, so full-vocabulary logits exist for at most `chunk_tokens` tokens at
once, in the forward and (through per-chunk recomputation) in the backward too. Given each row's
real completion length, a batch runs padding-free where that costs less (see `packing`).
"""

from __future__ import annotations

from dataclasses import dataclass

import sys

import torch
from torch.utils.checkpoint import checkpoint

from lmpo.algos import entropy_from_logits, token_logprobs
from lmpo.models.packing import Layout, can_pack_trunk, pack_completions, packed_states, trunk_layout
from lmpo.models.segments import cpu_autocast, round_up, token_grain


@dataclass
class TokenOutputs:
    """Per completion token [B, T]: log-prob, entropy (if asked) and the trunk's last hidden
    state at the position that predicts the token (if asked; [B, T, H], for a value head)."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    hidden: torch.Tensor | None = None


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids for a left-padded batch: 0 at each row's first real token."""
    return (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)


def context_length(model_or_config) -> int | None:
    """A model's context length, from its config (None when the config names none)."""
    config = getattr(model_or_config, "config", model_or_config)
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def completion_inputs(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                      context: int | None = None) -> dict[str, torch.Tensor]:
    """Forward inputs for prompt + completion. Every completion position stays visible to
    attention (tool output in a multi-turn trajectory is context though it carries no loss);
    right padding after the end is harmless because attention is causal. With the model's
    `context`, positions stop at its last one: a row with a long prompt, padded to another
    row's long completion, would count on past it, where a model with learned position
    embeddings has none (only padding gets there, and no real token attends to it)."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, torch.ones_like(completion_ids)], dim=1)
    positions = positions_from_mask(attention_mask)
    if context is not None:
        positions = positions.clamp(max=context - 1)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": positions}


def _check_inputs(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor) -> None:
    """Shapes and dtypes only (no pass over the values): 2-D integer ids, a mask like the prompt."""
    for name, ids in (("prompt_ids", prompt_ids), ("completion_ids", completion_ids)):
        if ids.dim() != 2 or ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise ValueError(f"{name} must be 2-D integer token ids [B, length], got shape {tuple(ids.shape)} "
                             f"of {ids.dtype}")
    if prompt_mask.shape != prompt_ids.shape:
        raise ValueError(f"prompt_mask shape {tuple(prompt_mask.shape)} != prompt_ids shape {tuple(prompt_ids.shape)}")
    if completion_ids.size(0) != prompt_ids.size(0):
        raise ValueError(f"completion_ids has {completion_ids.size(0)} rows, prompt_ids {prompt_ids.size(0)}: "
                         "one completion per prompt row")


def completion_outputs(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                       completion_ids: torch.Tensor, temperature: float = 1.0, *, entropy: bool = False,
                       entropy_grad: bool = False, hidden: bool = False, chunk_tokens: int = 0,
                       lengths: torch.Tensor | None = None) -> TokenOutputs:
    """Log-probs [B, T] of `completion_ids` given left-padded prompts [B, P], and optionally the
    entropy of the temperature-scaled distribution (with gradient only if `entropy_grad`) and
    the last hidden states. All in fp32, whatever the model's dtype or autocast.

    `chunk_tokens > 0` computes the same numbers with the output head applied to at most that
    many completion tokens at a time (see `chunked_token_outputs`); 0 applies it to all at once.
    `lengths` [B]: only each row's first `lengths[b]` completion tokens are wanted (later ones
    come out 0), and the forward runs padded, packed or with shared prompts packed once, whichever
    `packing.choose_layout` costs least (the same numbers to float tolerance)."""
    as_reference = getattr(model, "as_reference", None)  # a LoRA policy seen as its base (`lora.AdapterDisabled`)
    if as_reference is not None:
        # called on the wrapper, the forward ran padded where the policy's ran packed: a k1 of
        # -2e-8, not 0, before any update
        with as_reference() as base:
            return completion_outputs(base, prompt_ids, prompt_mask, completion_ids, temperature, entropy=entropy,
                                      entropy_grad=entropy_grad, hidden=hidden, chunk_tokens=chunk_tokens,
                                      lengths=lengths)
    _check_inputs(prompt_ids, prompt_mask, completion_ids)
    layout = Layout("padded") if lengths is None or hidden else layout_for(model, prompt_ids, prompt_mask, lengths)
    if layout.kind != "padded":
        return packed_token_outputs(model, prompt_ids, prompt_mask, completion_ids, lengths, temperature,
                                    entropy=entropy, entropy_grad=entropy_grad, chunk_tokens=chunk_tokens,
                                    share_prompts=layout.kind == "shared", row_tokens=layout.row_tokens,
                                    segments=layout.kind == "segments")
    if chunk_tokens > 0:
        return chunked_token_outputs(model, prompt_ids, prompt_mask, completion_ids, temperature, chunk_tokens,
                                     entropy=entropy, entropy_grad=entropy_grad, hidden=hidden)
    width = completion_ids.size(1)
    out = model(**completion_inputs(prompt_ids, prompt_mask, completion_ids, context_length(model)),
                logits_to_keep=width + 1,
                use_cache=False, output_hidden_states=hidden)
    logits = out.logits[:, :-1]
    result = TokenOutputs(token_logprobs(logits, completion_ids, temperature))
    if entropy or entropy_grad:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            result.entropy = entropy_from_logits(logits if entropy_grad else logits.detach(), temperature)
    if hidden:
        result.hidden = out.hidden_states[-1][:, -(width + 1):-1]
    return result


def causal_lm_parts(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(trunk, output head) of a Hugging Face causal LM, or of the model a PEFT wrapper holds
    (whose LoRA layers stay in the trunk, so the adapter and `disable_adapter` still apply)."""
    peft = sys.modules.get("peft")
    if peft is not None and isinstance(model, peft.PeftModel):
        model = model.get_base_model()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    config = getattr(model, "config", None)
    rescaled = any(getattr(config, name, None) not in (None, 1.0)
                   for name in ("final_logit_softcapping", "logit_scale", "logits_scaling"))
    if head is None or rescaled or getattr(model, "base_model", model) is model:
        raise ValueError(f"chunked log-probs need a causal LM whose logits are head(trunk(x)); "
                         f"{type(model).__name__} is not one (set the chunk size to 0)")
    return model.base_model, head


def chunked_token_outputs(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                          completion_ids: torch.Tensor, temperature: float, chunk_tokens: int, *,
                          entropy: bool = False, entropy_grad: bool = False, hidden: bool = False) -> TokenOutputs:
    """`completion_outputs` with the head applied `chunk_tokens` flattened tokens at a time.

    Under autograd each chunk runs in `torch.utils.checkpoint`: only its hidden states are kept,
    and its logits are recomputed in the backward, one chunk at a time."""
    trunk, head = causal_lm_parts(model)
    width = completion_ids.size(1)
    inputs = completion_inputs(prompt_ids, prompt_mask, completion_ids, context_length(model))
    states = trunk(**inputs, use_cache=False).last_hidden_state
    states = states[:, -(width + 1):-1]
    flat_states, flat_ids = states.reshape(-1, states.size(-1)), completion_ids.reshape(-1)
    logprobs, entropies = head_outputs(head, flat_states, flat_ids, temperature, chunk_tokens,
                                       entropy or entropy_grad, entropy_grad)
    result = TokenOutputs(logprobs.view_as(completion_ids))
    if entropies is not None:
        result.entropy = entropies.view_as(completion_ids)
    if hidden:
        result.hidden = states
    return result


def head_outputs(head: torch.nn.Module, states: torch.Tensor, ids: torch.Tensor, temperature: float,
                 chunk_tokens: int, want_entropy: bool, entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [K] (and entropies [K]) of `ids` from the states [K, H] that predict them, the
    head applied `chunk_tokens` at a time (all at once for 0); under autograd each chunk runs in
    `torch.utils.checkpoint`, so its logits are recomputed in the backward, not kept."""

    def score(chunk: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = head(chunk)
        logprobs = token_logprobs(logits, targets, temperature)
        if not want_entropy:
            return logprobs, logprobs.new_zeros(())
        return logprobs, entropy_from_logits(logits if entropy_grad else logits.detach(), temperature)

    if chunk_tokens <= 0:
        pieces = [score(states, ids)]
    else:
        grad = torch.is_grad_enabled()
        pieces = []
        for start in range(0, ids.numel(), chunk_tokens):
            chunk, targets = states[start:start + chunk_tokens], ids[start:start + chunk_tokens]
            pieces.append(checkpoint(score, chunk, targets, use_reentrant=False) if grad else score(chunk, targets))
    logprobs = pieces[0][0] if len(pieces) == 1 else torch.cat([p[0] for p in pieces])
    if not want_entropy:
        return logprobs, None
    entropies = pieces[0][1] if len(pieces) == 1 else torch.cat([p[1] for p in pieces])
    return logprobs, entropies if entropy_grad else entropies.detach()


def layout_for(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
               lengths: torch.Tensor) -> Layout:
    """padded, packed or shared (see `packing.choose_layout`), costed from the model's shapes."""
    if not can_pack(model):
        return Layout("padded")
    return trunk_layout(causal_lm_parts(model)[0], prompt_ids, prompt_mask, lengths)


def can_pack(model: torch.nn.Module) -> bool:
    """A causal LM whose trunk can run packed (see `packing.can_pack_trunk`)."""
    try:
        trunk, _ = causal_lm_parts(model)
    except ValueError:
        return False
    return can_pack_trunk(trunk)


def packed_token_outputs(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                         completion_ids: torch.Tensor, lengths: torch.Tensor, temperature: float = 1.0, *,
                         entropy: bool = False, entropy_grad: bool = False, chunk_tokens: int = 0,
                         share_prompts: bool = False, row_tokens: int = 0, segments: bool = False) -> TokenOutputs:
    """`completion_outputs` padding-free: the sequences packed into rows (see `packing`; with
    `share_prompts`, each distinct prompt once), the head applied only to the scored tokens;
    positions past `lengths` come out 0."""
    trunk, head = causal_lm_parts(model)
    packed = pack_completions(prompt_ids, prompt_mask, completion_ids, lengths.to(completion_ids.device),
                              row_tokens=row_tokens, share_prompts=share_prompts, segments=segments)
    at, targets, scored = packed.predictor, packed.targets, packed.targets.numel()
    if packed.plan is not None and cpu_autocast(completion_ids.device):  # the head on the grid too
        extra = round_up(scored, token_grain(scored)) - scored
        at, targets = torch.nn.functional.pad(at, (0, extra)), torch.nn.functional.pad(targets, (0, extra))
    states = packed_states(trunk, packed, at)
    logprobs, entropies = head_outputs(head, states, targets, temperature, chunk_tokens,
                                       entropy or entropy_grad, entropy_grad)
    logprobs, entropies = logprobs[:scored], None if entropies is None else entropies[:scored]
    size = completion_ids.numel()
    result = TokenOutputs(_scatter(logprobs, packed.scatter, size).view_as(completion_ids))
    if entropies is not None:
        result.entropy = _scatter(entropies, packed.scatter, size).view_as(completion_ids)
    return result


def _scatter(values: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    return values.new_zeros(size).index_put((index,), values)


def completion_logprobs(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                        completion_ids: torch.Tensor, temperature: float = 1.0,
                        with_entropy: bool = False, chunk_tokens: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [B, T] (and, with `with_entropy`, the entropy [B, T] without gradient)."""
    out = completion_outputs(model, prompt_ids, prompt_mask, completion_ids, temperature, entropy=with_entropy,
                             chunk_tokens=chunk_tokens)
    return out.logprobs, out.entropy
