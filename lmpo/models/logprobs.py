"""Per-token log-probs of completions under a causal LM, in fp32.

Only the completion positions go through the output head (`logits_to_keep`), so no logits
are materialised for prompt tokens.
"""

from __future__ import annotations

import torch

from lmpo.algos import entropy_from_logits, token_logprobs


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids for a left-padded batch: 0 at each row's first real token."""
    return (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)


def completion_logprobs(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                        completion_ids: torch.Tensor, temperature: float = 1.0,
                        with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [B, T] of `completion_ids` given left-padded prompts [B, P].

    Every completion position stays visible to attention (tool output in a multi-turn
    trajectory is context even though it carries no loss); right padding after the end is
    harmless because attention is causal. With `with_entropy`, also the entropy [B, T] of the
    temperature-scaled distribution, without gradient.
    """
    width = completion_ids.size(1)
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, torch.ones_like(completion_ids)], dim=1)
    out = model(input_ids=input_ids, attention_mask=attention_mask,
                position_ids=positions_from_mask(attention_mask), logits_to_keep=width + 1, use_cache=False)
    logits = out.logits[:, :-1]
    logprobs = token_logprobs(logits, completion_ids, temperature)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach(), temperature)
    return logprobs, entropy
