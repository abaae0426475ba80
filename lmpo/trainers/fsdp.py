"""Fully sharded data parallelism with PyTorch's FSDP2 (`fully_shard`): each process holds a
1/N shard of every weight, gradient and optimizer moment, and gathers a layer's full weights
only while that layer runs. Checkpoints are PyTorch distributed checkpoints (each process
writes its own shards); the final model is gathered into one ordinary Hugging Face directory.

Sampling does not run on the sharded model: a decoding loop makes a different number of
forward calls on each process (each stops when its own sequences end), and every sharded
forward is a collective, so it would deadlock. Sampling and evaluation use a plain copy of the
model instead, refreshed from the gathered weights after each update — what RL frameworks do
with a separate rollout engine.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch


def shard_model(model: torch.nn.Module, device: torch.device, world: int) -> torch.nn.Module:
    """Shard each decoder layer (the classes a Hugging Face model lists in `_no_split_modules`),
    then the rest (embeddings, final norm, head) as the root group. In place; returns `model`."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world,))
    layer_names = set(getattr(_inner(model), "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in layer_names]
    if not layers:
        raise ValueError(f"fsdp: {type(_inner(model)).__name__} names no decoder layer classes "
                         f"(_no_split_modules); cannot choose the units to shard")
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _inner(model: torch.nn.Module) -> torch.nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every weight in full on every process (a collective: all processes call it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def plain_copy(model: torch.nn.Module) -> torch.nn.Module:
    """An unsharded copy to sample from (made before sharding)."""
    return copy.deepcopy(model).eval().requires_grad_(False)


def refresh(copy_: torch.nn.Module, sharded: torch.nn.Module) -> None:
    """Load the sharded model's current weights into the plain copy (all processes call it)."""
    state = full_state_dict(sharded)
    missing, unexpected = copy_.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(getattr(copy_, "config", None), "tie_word_embeddings", False) else set()
    if [k for k in missing if k not in tied] or unexpected:
        raise RuntimeError(f"fsdp: the sampling copy does not match the sharded model: missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]}")


def save_sharded(model: torch.nn.Module, optimizer, directory: Path) -> None:
    """Each process writes its shards of the weights and the optimizer state (a collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    if not all(bool(torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all()) for p in model.parameters()):
        raise RuntimeError("the weights are not finite; refusing to write them as a checkpoint")
    dcp.save({"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)},
             checkpoint_id=str(directory))


def load_sharded(model: torch.nn.Module, optimizer, directory: Path) -> None:
    """Read this process's shards back into the model and the optimizer (a collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                         set_model_state_dict, set_optimizer_state_dict)

    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id=str(directory))
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])
