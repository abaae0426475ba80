"""`make_engine(kind, ...)`: the built-in engine or a colocated vLLM one, chosen by name.

`vllm` fails clearly where vLLM cannot run (not installed, no CUDA); `auto` takes vLLM where it
can run and the built-in engine elsewhere, saying which in one line.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

import torch

from lmpo.rollout.engines import Engine, LocalEngine, stop_token_ids

EngineKind = Literal["auto", "local", "vllm"]
INSTALL_HINT = "pip install vllm (on a Linux machine with an NVIDIA GPU and CUDA)"


class EngineUnavailableError(ValueError):
    """The engine asked for cannot run here: an option that this machine cannot honour, refused
    (by `check_engine`) before a trainer writes or loads anything."""


def check_engine(kind: str) -> None:
    """Refuse `vllm` where it cannot run, and an unknown kind, before a trainer's run starts."""
    choose_engine(kind, vllm_availability() if kind == "vllm" else VLLMAvailability(False, False), "cpu")


@dataclass(frozen=True)
class VLLMAvailability:
    importable: bool
    cuda: bool
    version: str = ""

    @property
    def missing(self) -> str:
        """What stops vLLM from running here ("" when nothing does)."""
        if not self.importable:
            return "vllm is not installed"
        if not self.cuda:
            return f"vllm {self.version} is installed but no CUDA GPU is visible to torch"
        return ""


def vllm_availability() -> VLLMAvailability:
    """Whether vLLM could run, without importing it (that takes seconds and may initialise CUDA)."""
    importable = importlib.util.find_spec("vllm") is not None
    version = ""
    if importable:
        try:
            version = importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            version = "unknown"
    return VLLMAvailability(importable, torch.cuda.is_available(), version)


def choose_engine(kind: str, availability: VLLMAvailability, trainer_device: str = "") -> tuple[str, str]:
    """("local" or "vllm", a one-line message, "" for an explicit local). Raises
    `EngineUnavailableError` for `vllm` where it cannot run."""
    if kind == "local":
        return "local", ""
    if kind == "vllm":
        if availability.missing:
            raise EngineUnavailableError(f"engine=vllm: {availability.missing}; install it with {INSTALL_HINT}, "
                                         f"or use engine=local (the built-in engine)")
        return "vllm", f"[engine] vllm {availability.version}, colocated on the GPU"
    if kind != "auto":
        raise ValueError(f"engine={kind!r} must be auto, local or vllm")
    if trainer_device.startswith("cpu"):
        return "local", "[engine] built-in engine (the trainer runs on the CPU)"
    if availability.missing:
        return "local", f"[engine] built-in engine ({availability.missing}; for faster rollouts: {INSTALL_HINT})"
    return "vllm", f"[engine] vllm {availability.version}, colocated on the GPU"


def make_engine(kind: str, model: torch.nn.Module, tokenizer, model_dir: str | None = None, *,
                generator: torch.Generator | None = None, seed: int = 0, trainer_device: str = "",
                gpu_memory_utilization: float = 0.3, dtype: str = "auto", enable_lora: bool = False,
                max_model_len: int | None = None, log: Callable[[str], None] = print,
                availability: VLLMAvailability | None = None, trust_remote_code: bool = False) -> Engine:
    """The engine for `kind` (auto, local or vllm). vLLM loads `model_dir` (the directory the
    trainer's model came from); without one, the current model is saved to a temporary
    directory for it. The caller syncs the trainer's weights after every update.
    `trust_remote_code` lets vLLM run the code a model directory ships, as the trainer did."""
    chosen, message = choose_engine(kind, availability or vllm_availability(), trainer_device)
    if message:
        log(message)
    if chosen == "local":
        return LocalEngine(model, stop_token_ids(model, tokenizer), tokenizer.pad_token_id, generator=generator)
    from lmpo.rollout.vllm_engine import VLLMEngine, is_peft_model

    if not _is_model_dir(model_dir):
        if is_peft_model(model):
            raise ValueError("a LoRA policy on vLLM needs model_dir: the directory of its base model")
        model_dir = tempfile.mkdtemp(prefix="lmpo-vllm-model-")
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
    engine = VLLMEngine(model_dir, tokenizer, gpu_memory_utilization=gpu_memory_utilization, dtype=dtype, seed=seed,
                        enable_lora=enable_lora, max_model_len=max_model_len, trust_remote_code=trust_remote_code,
                        eos_ids=stop_token_ids(model, tokenizer))
    # the directory holds the starting weights; a resumed or adapted policy has others
    engine.sync_weights(model)
    return engine


def _is_model_dir(path: str | None) -> bool:
    return bool(path) and (Path(path) / "config.json").is_file()
