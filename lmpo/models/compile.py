"""`torch.compile` for the blocks of a transformer that are pure tensor code: its RMSNorms and
its MLPs. Their elementwise chains (RMSNorm's square, mean, rsqrt and two products; the MLP's
SiLU and gating product, forward and backward) become a few fused kernels, while attention,
whose inputs lmpo plans per batch (see `segments`), stays eager, so the compiled graphs never
see a plan and never recompile for one. One compiled forward per block class serves every
layer (dynamic shapes: one graph for all token counts, another per autocast or grad mode).

Measured (README, "Speed against TRL"; `bench/compile_speed.py --what blocks`): 1.03-1.04x on
a 3.7M model's forward and backward on a 2-core CPU, none on the 1M demo model, 1.07x on an H200
(a 0.5B shape, bf16), and no clear gain in whole training steps; so the trainers leave it off
unless asked (`--compile_blocks true`). The first step pays the compile (seconds). Inductor
builds C++ on the CPU, so it needs a compiler there.
"""

from __future__ import annotations

import os
import shutil

import torch

_COMPILED: dict[type, type] = {}


def compile_blocks(model: torch.nn.Module) -> int:
    """Switch `model`'s RMSNorms and plain MLPs (made of `nn.Linear`s and activations only, so
    not those holding LoRA layers) to one compiled forward per class, in place: the parameters,
    state dict, saving and `copy.deepcopy` are unchanged (the class is swapped for a subclass of
    the same name). Returns the number of blocks switched; calling it again switches none."""
    switched = 0
    for module in model.modules():
        cls = type(module)
        if cls in _COMPILED.values() or not _is_pure_block(module):
            continue
        module.__class__ = _compiled_class(cls)
        switched += 1
    return switched


def uncompiled_blocks(model: torch.nn.Module) -> int:
    """Undo `compile_blocks`; returns the number of blocks switched back."""
    switched = 0
    for module in model.modules():
        original = vars(type(module)).get("_lmpo_eager_class")
        if original is not None:
            module.__class__ = original
            switched += 1
    return switched


def check_compiler(device: torch.device) -> None:
    """Inductor compiles C++ for the CPU: fail before the run starts when there is no compiler."""
    if device.type != "cpu":
        return
    compiler = os.environ.get("CXX", "g++")
    if not any(shutil.which(c) for c in (compiler, "g++", "clang++", "c++")):
        raise ValueError(f"compile_blocks on the CPU needs a C++ compiler for torch.compile (inductor); none of "
                         f"{compiler}, g++, clang++, c++ is on PATH: install one (e.g. `apt install g++`) or drop "
                         "--compile_blocks")


def _is_pure_block(module: torch.nn.Module) -> bool:
    name = type(module).__name__
    if name.endswith("RMSNorm"):
        return not any(True for _ in module.children())
    if name.endswith("MLP"):
        inner = [m for m in module.modules() if m is not module]  # Linears and parameterless leaves (activations)
        return any(type(m) is torch.nn.Linear for m in inner) and all(
            type(m) is torch.nn.Linear or not any(True for _ in m.parameters()) and not any(True for _ in m.children())
            for m in inner)
    return False


def _compiled_class(cls: type) -> type:
    compiled_cls = _COMPILED.get(cls)
    if compiled_cls is None:
        compiled = torch.compile(cls.forward, dynamic=True)

        def forward(self, *args, **kwargs):
            return compiled(self, *args, **kwargs)

        compiled_cls = type(cls.__name__, (cls,), {"forward": forward, "__module__": cls.__module__,
                                                   "__qualname__": cls.__qualname__, "_lmpo_eager_class": cls})
        _COMPILED[cls] = compiled_cls
    return compiled_cls
