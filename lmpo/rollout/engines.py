"""Engines: whatever turns prompt token ids into sampled token ids with behaviour log-probs.

The protocol is two methods, so that the fast CPU decoder, plain Hugging Face generation and
an inference server all plug into the agent loop and the trainers the same way:
`generate(prompts, params, max_new_tokens=None) -> list[Sample]` and
`sync_weights(model)` after each policy update. Engines may also offer
`score(prompt_ids, completion_ids) -> list[float]` (teacher-forced log-probs at temperature 1),
which the weight-sync probe (`weight_probe.py`) uses to check that they sample the trainer's weights.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import torch

from lmpo.models.logprobs import completion_outputs
from lmpo.rollout.engine import Backend, generate
from lmpo.rollout.trajectory import Sample
from lmpo.rollout.types import FINISH_EOS, FINISH_LENGTH, SamplingParams


class Engine(Protocol):
    """What the agent loop and the trainers sample with (see this module's docstring):
    `LocalEngine` in this process, `VLLMEngine` on vLLM."""

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 max_new_tokens: Sequence[int] | None = None) -> list[Sample]:
        """One sample per prompt; `max_new_tokens[i]` (if given) caps prompt i below `params.max_new_tokens`."""

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Sample from `model`'s current weights from now on."""


def stop_token_ids(model: torch.nn.Module, tokenizer) -> list[int]:
    """The tokens that end a completion: the tokenizer's EOS, then any other that the model's
    generation config names. Chat models often end a turn with a token of their own that only
    the generation config lists (Gemma's `<end_of_turn>`, Llama 3's `<|eot_id|>`), and
    transformers' `generate` and vLLM stop on all of them; on the tokenizer's alone such a model
    ran past its turn to `max_new_tokens`, every completion unterminated."""
    config = getattr(model, "generation_config", None)
    ids: list[int] = []
    for source in (tokenizer.eos_token_id, getattr(config, "eos_token_id", None)):
        for token in source if isinstance(source, (list, tuple)) else [source]:
            if isinstance(token, int) and token not in ids:
                ids.append(token)
    return ids


class LocalEngine:
    """Samples from a model held in this process (colocated with the trainer): the compiled
    CPU decoder for Llama-family models it implements exactly, else Hugging Face's forward
    with a KV cache. Holding the live module, it always samples the newest weights."""

    def __init__(self, model: torch.nn.Module, eos_id: int | Sequence[int], pad_id: int,
                 generator: torch.Generator | None = None, backend: Backend = "auto"):
        self.model, self.eos_id, self.pad_id = model, eos_id, pad_id
        self.eos_ids = set(eos_id) if isinstance(eos_id, (list, tuple)) else {eos_id}
        self.generator, self.backend = generator, backend

    def sync_weights(self, model: torch.nn.Module) -> None:
        self.model = model

    def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        """Log-probs (temperature 1, fp32) of `completion_ids` after `prompt_ids` under the held model."""
        return teacher_forced_logprobs(self.model, prompt_ids, completion_ids)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 max_new_tokens: Sequence[int] | None = None) -> list[Sample]:
        caps = list(max_new_tokens) if max_new_tokens is not None else [params.max_new_tokens] * len(prompts)
        widest = max(caps)
        if widest < params.max_new_tokens:
            params = SamplingParams(params.temperature, params.top_p, params.top_k, widest)
        rollout = generate(self.model, prompts, params, eos_id=self.eos_id, pad_id=self.pad_id,
                           generator=self.generator, backend=self.backend, caps=caps)
        samples = []
        # a row's tokens before its own cap do not depend on the cap: cutting the longer
        # generation is exactly what generating with the smaller cap would have sampled
        for tokens, logprobs, reason, cap in zip(rollout.completion_token_lists(), rollout.logprobs.tolist(),
                                                 rollout.finish_reasons, caps):
            if len(tokens) > cap:
                tokens, reason = tokens[:cap], FINISH_LENGTH
            elif reason == FINISH_EOS and len(tokens) == 0:
                reason = FINISH_LENGTH
            samples.append(Sample(tokens, logprobs[:len(tokens)], reason))
        return samples


def teacher_forced_logprobs(model: torch.nn.Module, prompt_ids: Sequence[int],
                            completion_ids: Sequence[int]) -> list[float]:
    """One sequence's completion log-probs at temperature 1, in eval mode and without gradient."""
    if not prompt_ids or not completion_ids:
        raise ValueError("scoring needs at least one prompt token and one completion token")
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        prompt = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
        completion = torch.tensor([list(completion_ids)], dtype=torch.long, device=device)
        with torch.no_grad():
            out = completion_outputs(model, prompt, torch.ones_like(prompt), completion)
    finally:
        model.train(was_training)
    return out.logprobs[0].float().tolist()
