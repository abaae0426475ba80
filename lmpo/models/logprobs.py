"""Per-token log-probs of completions under a causal LM, in fp32.

Only the completion positions go through the output head (`logits_to_keep`), so no logits
are materialised for prompt tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lmpo.algos import entropy_from_logits, token_logprobs


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


def completion_inputs(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                      completion_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Forward inputs for prompt + completion. Every completion position stays visible to
    attention (tool output in a multi-turn trajectory is context though it carries no loss);
    right padding after the end is harmless because attention is causal."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, torch.ones_like(completion_ids)], dim=1)
    return {"input_ids": input_ids, "attention_mask": attention_mask,
            "position_ids": positions_from_mask(attention_mask)}


def completion_outputs(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                       completion_ids: torch.Tensor, temperature: float = 1.0, *, entropy: bool = False,
                       entropy_grad: bool = False, hidden: bool = False) -> TokenOutputs:
    """Log-probs [B, T] of `completion_ids` given left-padded prompts [B, P], and optionally the
    entropy of the temperature-scaled distribution (with gradient only if `entropy_grad`) and
    the last hidden states."""
    width = completion_ids.size(1)
    out = model(**completion_inputs(prompt_ids, prompt_mask, completion_ids), logits_to_keep=width + 1,
                use_cache=False, output_hidden_states=hidden)
    logits = out.logits[:, :-1]
    result = TokenOutputs(token_logprobs(logits, completion_ids, temperature))
    if entropy or entropy_grad:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            result.entropy = entropy_from_logits(logits if entropy_grad else logits.detach(), temperature)
    if hidden:
        result.hidden = out.hidden_states[-1][:, -(width + 1):-1]
    return result


def completion_logprobs(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                        completion_ids: torch.Tensor, temperature: float = 1.0,
                        with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [B, T] (and, with `with_entropy`, the entropy [B, T] without gradient)."""
    out = completion_outputs(model, prompt_ids, prompt_mask, completion_ids, temperature, entropy=with_entropy)
    return out.logprobs, out.entropy
