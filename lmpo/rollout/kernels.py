"""Compiled decoding kernels (`decode_kernels.c`), built on first use and loaded with ctypes.

On a small model a decoding step costs as much in the number of tensor operations as in
arithmetic: attention over a short KV cache goes through a batched matmul made for large
matrices, and RMSNorm through half a dozen elementwise operations. The C kernels do RMSNorm,
SwiGLU and RoPE + cache write + attention in one call each, which is what lets the engine
beat `model.generate` by the margin `bench/rollout_speed.py` reports.

They are optional: when no C compiler is found, the build fails, the model is not fp32 on CPU,
or `LMPO_DECODE_KERNELS=0` is set, `FastLlamaDecoder` uses its PyTorch path, which computes the
same thing. The shared library is cached per source, compiler flags and CPU in
`$LMPO_KERNEL_CACHE` (default `~/.cache/lmpo/kernels`), so it is compiled once per machine
(about a second); the build writes to a temporary file and renames it, so concurrent
processes never load a half-written library.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import warnings
from functools import lru_cache
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("decode_kernels.c")
# -fassociative-math lets dot products vectorise; finite-math-only is not set, -inf stays -inf
FLAGS = ["-O3", "-march=native", "-fPIC", "-shared", "-fno-math-errno", "-fassociative-math",
         "-fno-signed-zeros", "-fno-trapping-math", "-std=c11"]
# the kernels share their rows among the OpenMP threads of the runtime PyTorch loaded; a
# compiler without OpenMP builds them single-threaded
OPENMP = ["-fopenmp"]
_i64, _f32, _ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
SIGNATURES = {
    "rms_norm": [_ptr, _ptr, _i64, _i64, _f32, _i64],
    "silu_mul": [_ptr, _ptr, _i64, _i64, _i64],
    "sample_rows": [_ptr, _ptr, _f32, _i64, _i64, _i64, _ptr, _ptr, _ptr],
    "decode_attention": [_ptr, _i64, _i64, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _i64, _ptr,
                         _i64, _i64, _i64, _i64, _i64, _i64, _f32, _i64],
}


class DecodeKernels:
    """Typed wrappers around the compiled functions; every tensor is fp32, contiguous, on CPU."""

    def __init__(self, library: ctypes.CDLL, path: Path):
        self.path = path
        for name, argtypes in SIGNATURES.items():
            function = getattr(library, name)
            function.argtypes, function.restype = argtypes, None
        self._lib = library

    def rms_norm(self, x: torch.Tensor, eps: float, threads: int = 1) -> torch.Tensor:
        """RMSNorm of each row without the gain: x / sqrt(mean(x^2) + eps); the rows shared
        among `threads` OpenMP threads (the same result for any count)."""
        _check(x=x)
        out = torch.empty_like(x)
        self._lib.rms_norm(x.data_ptr(), out.data_ptr(), x.numel() // x.size(-1), x.size(-1), eps,
                           _usable(threads))
        return out

    def silu_mul(self, gate_up: torch.Tensor, threads: int = 1) -> torch.Tensor:
        """`[gate | up]` rows -> silu(gate) * up; the rows shared among `threads` OpenMP threads
        (the same result for any count)."""
        _check(gate_up=gate_up)
        dim = gate_up.size(-1) // 2
        out = gate_up.new_empty(*gate_up.shape[:-1], dim)
        self._lib.silu_mul(gate_up.data_ptr(), out.data_ptr(), gate_up.numel() // gate_up.size(-1), dim,
                           _usable(threads))
        return out

    def sample_rows(self, logits: torch.Tensor, uniform: torch.Tensor | None,
                    inv_temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens [B] and their log-probs [B] from logits [B, V] (see `sample_next`): inverse-CDF
        draws with `uniform` [B, 1], or the most likely token where `uniform` is None."""
        _check(logits=logits, **({} if uniform is None else {"uniform": uniform}))
        rows, vocab = logits.shape
        tokens = torch.empty(rows, dtype=torch.long)
        logprobs, scratch = torch.empty(rows), torch.empty(vocab)
        self._lib.sample_rows(logits.data_ptr(), 0 if uniform is None else uniform.data_ptr(), inv_temperature,
                              rows, vocab, uniform is None, tokens.data_ptr(), logprobs.data_ptr(),
                              scratch.data_ptr())
        return tokens, logprobs

    def decode_attention(self, qkv: torch.Tensor, k_offset: int, v_offset: int, position: torch.Tensor,
                         cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         key_bias: torch.Tensor, length: int, n_heads: int, n_kv: int, threads: int = 1) -> torch.Tensor:
        """RoPE on the new token's q and k, k and v written to the cache at `length`, attention
        over keys 0..length. qkv [B, width]; k_cache [B * n_kv, T / 16, d, 16] (see
        `blocked_keys`), v_cache [B * n_kv, T, d]; key_bias [B * n_kv, T]. The sequences are shared
        among `threads` OpenMP threads (PyTorch's own pool)."""
        _check(qkv=qkv, cos=cos, sin=sin, k_cache=k_cache, v_cache=v_cache, key_bias=key_bias)
        _check(position=position, dtype=torch.int64)
        batch, (_, total, dim) = qkv.size(0), v_cache.shape
        out = qkv.new_empty(batch, n_heads * dim)
        self._lib.decode_attention(qkv.data_ptr(), qkv.stride(0), k_offset, v_offset, position.data_ptr(),
                                   cos.data_ptr(), sin.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
                                   key_bias.data_ptr(), key_bias.stride(0), out.data_ptr(), batch, n_heads,
                                   n_kv, dim, total, length, dim ** -0.5, _usable(threads))
        return out


def _check(dtype: torch.dtype = torch.float32, **tensors: torch.Tensor) -> None:
    """The C code reads raw memory: refuse what it would misread rather than return garbage."""
    for name, tensor in tensors.items():
        if tensor.dtype != dtype or tensor.device.type != "cpu" or not tensor.is_contiguous():
            raise ValueError(f"decoding kernel argument {name!r}: expected a contiguous {dtype} CPU tensor, "
                             f"got {tensor.dtype} on {tensor.device} with strides {tensor.stride()}")


KEY_BLOCK = 16  # LANES in decode_kernels.c

# GNU OpenMP cannot start threads in a forked child of a process that used them (it waits for
# the parent's pool forever), so after a fork the kernels run single-threaded
_forked = False


def _note_fork() -> None:
    global _forked
    _forked = True


def _usable(threads: int) -> int:
    """The OpenMP threads a kernel may start: one in a forked child."""
    return 1 if _forked else threads


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_note_fork)


def blocked_keys(keys_transposed: torch.Tensor) -> torch.Tensor:
    """[..., d, T] keys -> the kernel's layout [..., T / 16, d, 16]: blocks of 16 positions, each
    transposed, so that scoring a block of keys reads contiguous memory."""
    *rows, dim, total = keys_transposed.shape
    blocks = keys_transposed.reshape(*rows, dim, total // KEY_BLOCK, KEY_BLOCK)
    return blocks.transpose(-3, -2).contiguous()


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _cpu_identity() -> str:
    """-march=native code runs only where it was built: the cache key names the CPU."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        return "\n".join(sorted({line for line in info.splitlines() if line.startswith(("model name", "flags"))}))
    except OSError:
        return platform.processor() or platform.machine()


def _cache_dir() -> Path:
    configured = os.environ.get("LMPO_KERNEL_CACHE")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lmpo" / "kernels"


def build(compiler: str) -> Path:
    """Compile `decode_kernels.c` (once per source, flags and CPU) and return the library path."""
    key = hashlib.sha256("\0".join([SOURCE.read_text(), " ".join(FLAGS), compiler, _cpu_identity()]).encode())
    cache = _cache_dir()
    target = cache / f"decode_kernels-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=cache, suffix=".so.partial")
    os.close(fd)
    try:
        for extra in (OPENMP, []):
            result = subprocess.run([compiler, *FLAGS, *extra, str(SOURCE), "-o", partial, "-lm"],
                                    capture_output=True, text=True, timeout=120)
            if result.returncode == 0:
                break
        else:
            raise RuntimeError(f"{compiler} failed on {SOURCE.name}:\n{result.stderr.strip()}")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


@lru_cache(maxsize=1)
def load() -> DecodeKernels | None:
    """The compiled kernels, or None (with one warning saying why) where they cannot be used."""
    if os.environ.get("LMPO_DECODE_KERNELS", "1") == "0":
        return None
    if sys.platform == "win32" or sys.byteorder != "little":
        return None
    compiler = _compiler()
    if compiler is None:
        warnings.warn("lmpo: no C compiler found (set CC); decoding uses the slower PyTorch path", stacklevel=2)
        return None
    try:
        path = build(compiler)
        return DecodeKernels(ctypes.CDLL(str(path)), path)
    except (OSError, RuntimeError, AttributeError, subprocess.SubprocessError) as error:
        warnings.warn(f"lmpo: decoding kernels unavailable, using the PyTorch path: {error}", stacklevel=2)
        return None
