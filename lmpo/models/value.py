"""Critics for PPO: a value head on the policy's own trunk, or a separate value model.

A value V_t estimates the return from the state that predicts completion token t, read at the
same position as that token's logits.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_model, save_model
from torch import nn

from lmpo.models.logprobs import completion_inputs, context_length
from lmpo.models.lora import is_peft_model


class ValueHead(nn.Module):
    """A linear layer from the last hidden state to a scalar, zero-initialised so that the
    first advantages are the plain returns rather than noise."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden.float()).squeeze(-1)


class ValueModel(nn.Module):
    """A separate critic: a transformer trunk (e.g. a copy of the SFT model's) plus a value head.
    Given a LoRA model (a `PeftModel`), the trunk keeps its adapters, so only they and the head
    train: the critic then costs no gradient or optimizer state for its frozen weights."""

    def __init__(self, causal_lm: nn.Module):
        super().__init__()
        self.trunk = _trunk(causal_lm)
        self.head = ValueHead(causal_lm.config.hidden_size)

    def forward(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor) -> torch.Tensor:
        width = completion_ids.size(1)
        inputs = completion_inputs(prompt_ids, prompt_mask, completion_ids, context_length(self.trunk))
        hidden = self.trunk(**inputs, use_cache=False).last_hidden_state
        return self.head(hidden[:, -(width + 1):-1])

    def save(self, out_dir: str | Path) -> Path:
        path = Path(out_dir) / "value_model.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        save_model(self, str(path))
        return path

    def load(self, path: str | Path) -> None:
        load_model(self, str(path))


def _trunk(causal_lm: nn.Module) -> nn.Module:
    """The transformer without its LM head; a PEFT model's, with the adapter layers in it."""
    inner = causal_lm.get_base_model() if is_peft_model(causal_lm) else causal_lm
    return inner.base_model
