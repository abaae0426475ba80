"""Fitting a training step in memory: micro-batches by token budget, gradient checkpointing,
and parameter counts for the run's log line."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def micro_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Split rows of the given lengths into micro-batches whose padded cost (rows x longest row)
    is at most `max_tokens`; returns lists of row indices, each list longest rows first.

    Rows are taken longest first, so rows of similar length share a micro-batch and padding is
    small; the split is deterministic. A row longer than `max_tokens` gets a micro-batch of its
    own (it cannot be split here; its cost is over the budget).

    Gradient accumulation over the micro-batches gives the full batch's gradient only if each
    micro-batch's loss is scaled as its share of the full-batch loss: for a token-mean loss,
    divide each micro-batch's token sum by the token count of the whole batch (not of the
    micro-batch); for a sequence-mean loss, divide by the number of rows of the whole batch.
    Call `backward()` per micro-batch and `optimizer.step()` once after the last."""
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    if any(n < 0 for n in lengths):
        raise ValueError("lengths must be non-negative")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for index in order:
        # the first row of a batch is its longest, so the cost of adding a row is known
        if batches and (len(batches[-1]) + 1) * max(lengths[batches[-1][0]], 1) <= max_tokens:
            batches[-1].append(index)
        else:
            batches.append([index])
    return batches


def enable_gradient_checkpointing(model: torch.nn.Module) -> torch.nn.Module:
    """Recompute each transformer layer's activations in the backward instead of keeping them:
    activation memory drops from all layers' to about one layer's, for about a third more compute.

    Non-reentrant checkpointing works with frozen inputs (a LoRA model's embeddings need no
    gradient) and gives the same gradients; the KV cache is turned off, as it must be for it."""
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(target, "supports_gradient_checkpointing", False):
        raise ValueError(f"{type(target).__name__} does not support gradient checkpointing")
    kwargs = {"use_reentrant": False}
    if hasattr(target, "activation_checkpointing_enable"):  # the name from transformers 5.x on; the old one warns
        target.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        target.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    target.config.use_cache = False
    return model


def is_checkpointing(model: torch.nn.Module) -> bool:
    """Whether activation (gradient) checkpointing is on for `model`."""
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    flag = getattr(target, "is_activation_checkpointing", None)
    return bool(flag if flag is not None else target.is_gradient_checkpointing)


@dataclass(frozen=True)
class ParameterCounts:
    """Parameters of a model, for the log line."""

    total: int
    """Number of parameters (4-bit packed parameters count as stored)."""
    trainable: int
    """Number of parameters with `requires_grad` (the adapter's only, under LoRA)."""
    bytes: int
    """Bytes the parameters take, in their stored dtypes."""

    def describe(self) -> str:
        share = 100.0 * self.trainable / max(self.total, 1)
        return (f"{self.trainable:,} of {self.total:,} parameters trainable ({share:.2f}%), "
                f"{self.bytes / 2**20:,.1f} MiB of weights")


def critic_description(critic: torch.nn.Module | None) -> str:
    """The critic's own parameters for the set-up line ("" without a critic): the line's count is
    the policy's, and a separate critic is a second model (under LoRA, with its own adapter)."""
    if critic is None:
        return ""
    counts = parameter_counts(critic)
    share = 100.0 * counts.trainable / max(counts.total, 1)
    return (f" (its own {counts.trainable:,} of {counts.total:,} parameters trainable, {share:.2f}%; "
            f"the policy's count follows)")


def parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes held by the model's parameters (not counting gradients or optimizer state)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def parameter_counts(model: torch.nn.Module) -> ParameterCounts:
    """The model's parameters: how many in all, how many trainable (``requires_grad``; with LoRA,
    the adapter's) and the bytes their weights hold."""
    params = list(model.parameters())
    return ParameterCounts(total=sum(p.numel() for p in params),
                           trainable=sum(p.numel() for p in params if p.requires_grad),
                           bytes=parameter_bytes(model))
