"""Where a model runs and in what precision.

The precision policy is mixed precision with fp32 master weights: parameters and the optimizer's
state stay fp32, and the forward and backward run under bf16 autocast where the hardware does
bf16 natively (every CUDA GPU from Ampere on). bf16 weights alone would lose small updates (an
update below 2^-8 of a weight rounds away), and bf16 Adam moments drift; autocast keeps the
speed and activation memory of bf16 matmuls without either problem. Log-probs, entropies and
losses are computed in fp32 whatever the autocast (`lmpo.algos.token_logprobs` upcasts).
"""

from __future__ import annotations

import ctypes
import os
import platform
import warnings
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

PRECISIONS = ("auto", "fp32", "bf16")


def resolve_device(spec: str = "auto") -> torch.device:
    """`auto` (CUDA when a GPU is visible, else CPU), `cpu`, `cuda` or `cuda:N`."""
    spec = spec.strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda" or spec.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {spec!r} asked for, but this PyTorch sees no CUDA GPU "
                             f"(CUDA build: {torch.version.cuda or 'no, a CPU-only build'}); use --device cpu or auto")
        device = torch.device(spec)
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {spec!r} asked for, but only {torch.cuda.device_count()} CUDA GPU(s) are visible")
        return device
    raise ValueError(f"unknown device {spec!r}; use auto, cpu, cuda or cuda:N")


@dataclass(frozen=True)
class Precision:
    """How a model's parameters are stored and its forward runs."""

    param_dtype: torch.dtype
    """dtype of the parameters (and so of the optimizer state): always fp32 here."""
    autocast_dtype: torch.dtype | None
    """dtype of autocast's matmuls, or None for no autocast (plain fp32)."""
    description: str
    """One human line for the run's log."""

    @property
    def name(self) -> str:
        return "bf16" if self.autocast_dtype == torch.bfloat16 else "fp32"


def cpu_has_native_bf16() -> bool:
    """True where the CPU has bf16 instructions (x86 AVX512-BF16 or AMX, Arm BF16), so that bf16
    autocast is faster than fp32 rather than emulated and many times slower."""
    flags = _cpu_flags()
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def _cpu_flags() -> set[str]:
    cpuinfo = Path("/proc/cpuinfo")
    if platform.system() != "Linux" or not cpuinfo.exists():
        return set()  # unknown: treated as no native bf16, the safe side
    flags: set[str] = set()
    for line in cpuinfo.read_text(errors="replace").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return flags


def choose_precision(device: torch.device, requested: str = "auto") -> Precision:
    """The precision for `device`: `auto` is bf16 autocast on a CUDA GPU that supports bf16 and
    fp32 elsewhere; `bf16` asked for where it would be emulated warns once and gives fp32."""
    if requested not in PRECISIONS:
        raise ValueError(f"unknown precision {requested!r}; use one of {', '.join(PRECISIONS)}")
    fp32 = Precision(torch.float32, None, f"fp32 on {device}")
    if requested == "fp32":
        return fp32
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return Precision(torch.float32, torch.bfloat16,
                             f"bf16 autocast on {device}, fp32 master weights and optimizer state")
        if requested == "bf16":
            warnings.warn(f"precision bf16 asked for, but {torch.cuda.get_device_name(device)} has no native bf16; "
                          "running fp32", RuntimeWarning, stacklevel=2)
        return fp32
    if requested == "bf16":
        if cpu_has_native_bf16():
            return Precision(torch.float32, torch.bfloat16,
                             "bf16 autocast on cpu (native bf16), fp32 master weights and optimizer state")
        warnings.warn("precision bf16 asked for, but this CPU has no native bf16 (AVX512-BF16/AMX) and would "
                      "emulate it many times slower; running fp32", RuntimeWarning, stacklevel=2)
    return fp32


def autocast(precision: Precision, device: torch.device) -> AbstractContextManager:
    """Autocast to `precision.autocast_dtype` on `device`, or a no-op context for fp32."""
    if precision.autocast_dtype is None:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=precision.autocast_dtype)


def without_cpu_hub_kernels(model: torch.nn.Module) -> None:
    """Turn transformers' hub kernels off in a model on the CPU. transformers 5 loads a model with
    them on, and then each `train()` / `eval()` kernelizes the whole module tree again, though its
    kernel mapping has no CPU kernel: pure overhead (~1 ms a switch for a 4-layer model, more with
    depth), paid twice per RL step since sampling runs in eval mode. On GPUs they stay as loaded."""
    for module in model.modules():  # a PEFT or value-head wrapper holds the transformers model inside
        if getattr(module, "use_kernels", False) and all(p.device.type == "cpu" for p in module.parameters()):
            module.use_kernels = False  # transformers' setter: resets to the PyTorch layers


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


def reuse_freed_host_memory(up_to_bytes: int = 1 << 30) -> bool:
    """Have glibc's malloc keep freed memory for the next allocation instead of returning it to
    the operating system; True if it now does.

    By default glibc serves each large allocation (from 128 KiB, a threshold it raises up to 32
    MiB as it goes) with a fresh `mmap` and unmaps it on free, and hands the top of its heap back
    beyond a trim threshold. A training step allocates and frees the same activation-sized
    buffers every step, so every step the kernel faults in and zeroes their pages again: 3,500-
    16,000 page faults per step on the speed bench's DPO workload (3.7M model), 5-9% of the step
    at bf16 on a 2-core CPU. With both thresholds at `up_to_bytes`, buffers up to that size come
    from the heap and freed ones are reused. What it costs is memory not given back: after a
    peak the process stays at it, and the peak itself can grow a little (the embedded pipeline,
    one thread: 975 -> 1,020 MiB).

    Does nothing (False) where the C library is not glibc, or where the user chose malloc
    settings themselves (any `MALLOC_*` variable, or `GLIBC_TUNABLES` naming malloc): to keep
    glibc's defaults, set e.g. `MALLOC_TRIM_THRESHOLD_=131072`. Allocation only: no result
    changes.
    """
    if any(name.startswith("MALLOC_") for name in os.environ) or "malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):
            return False  # musl, macOS, Windows: their allocators behave differently
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, up_to_bytes)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, up_to_bytes))
    except (OSError, AttributeError):
        return False


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB: on Linux `VmHWM`, the high-water mark of its
    own address space. Not `ru_maxrss`: Linux carries a parent's peak into a child across fork and
    exec, so a run that `lmpo compare` started after training an SFT start in-process reported that
    training's peak as its own. Elsewhere `ru_maxrss` (kilobytes; bytes on macOS)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024
