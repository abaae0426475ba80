"""What every trainer shares: threads and seeds, optimizer and schedule, the metrics log."""

from __future__ import annotations

import json
import math
import os
import random
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import torch

from lmpo.models.device import reuse_freed_host_memory

Schedule = Literal["cosine", "linear", "constant"]


def setup_torch(threads: int, seed: int) -> int:
    """Fix torch's thread count and seed every generator, and have malloc reuse freed memory
    (`reuse_freed_host_memory`: a step's buffers are not faulted in anew every step); returns the
    thread count used.

    `threads <= 0` means one per available core. The count is chosen deliberately because a
    2-thread run slows several-fold when another process holds a core.
    """
    reuse_freed_host_memory()
    if threads <= 0:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(threads)
    random.seed(seed)
    torch.manual_seed(seed)
    return threads


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float,
                   betas: tuple[float, float] = (0.9, 0.999),
                   extra: list[tuple[torch.nn.Module, float]] = ()) -> torch.optim.AdamW:
    """AdamW, fused where PyTorch has the kernel (CPU, CUDA); no weight decay on 1-D parameters
    (biases, norms). `extra` modules (a critic) join with their own learning rate; the schedule
    scales every group alike."""
    groups = []
    for module, group_lr in [(model, lr), *extra]:
        decay, no_decay = [], []
        for p in module.parameters():
            if p.requires_grad:
                (decay if p.ndim >= 2 else no_decay).append(p)
        groups += [{"params": decay, "weight_decay": weight_decay, "lr": group_lr},
                   {"params": no_decay, "weight_decay": 0.0, "lr": group_lr}]
    params = [p for group in groups for p in group["params"]]
    # one fused kernel for every parameter instead of a dozen ops per parameter; same update to float rounding
    fused = bool(params) and all(p.device.type in ("cpu", "cuda") and p.dtype in (torch.float32, torch.bfloat16)
                                 for p in params)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused or None)


def make_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                   schedule: Schedule = "cosine", min_lr_ratio: float = 0.1) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up for `warmup_steps`, then cosine/linear decay to `min_lr_ratio`·lr, or constant."""
    if schedule not in ("cosine", "linear", "constant"):
        raise ValueError(f"lr_schedule must be cosine, linear or constant, got {schedule!r}")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1 - progress
        return min_lr_ratio + (1 - min_lr_ratio) * shape

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def schedule_at(scheduler: torch.optim.lr_scheduler.LambdaLR, position: int) -> None:
    """Put a `make_scheduler` schedule at `position`: the learning rate of its position-th step,
    however many updates ran before. Trainers whose updates per round vary (rounds without pairs
    or kept samples, skipped updates) index the schedule by rounds with it, so the decay ends at
    the last round; a pure function of the round, so a resumed run sets the same rate."""
    scheduler.last_epoch = position
    groups = scheduler.optimizer.param_groups
    for group, base, factor in zip(groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * factor(position)
    scheduler._last_lr = [group["lr"] for group in groups]  # what get_last_lr() reports


def grad_norm_and_clip(params, max_norm: float) -> float:
    """Clip gradients of `params` (a module or an iterable of parameters) to `max_norm`
    (0 = no clipping) and return the norm before clipping."""
    params = params.parameters() if isinstance(params, torch.nn.Module) else params
    params = [p for p in params if p.grad is not None]
    if not params:
        return 0.0
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    # sharded (FSDP) gradients give a sharded norm: the full value is the same on every process
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def keep_rows_through(path: Path, key: str, last: int) -> None:
    """Drop the rows of a metrics file whose `key` is past `last` (a resumed run writes them
    again), and any line a crash cut short."""
    if not path.exists():
        if last > 0:  # the run goes on from its checkpoint; what reads the log must know it starts late
            print(f"[metrics] {path} is missing: the rows of the first {last} {key}(s) are lost; the log starts again "
                  f"after {key} {last}, and `lmpo report` and `lmpo doctor` read only those rows")
        return
    kept = []
    lines = path.read_text(errors="replace").splitlines()
    for lineno, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict):
            if lineno < len(lines) and line.strip():  # not what a crash cuts short: say what is lost
                print(f"[metrics] {path}: line {lineno} is damaged (not a JSON object); the resumed run's log "
                      f"goes on without it")
            continue
        if "stopped" in row and row.get(key) == last:  # a run stopped at its cap there goes on: not its ending
            break
        if row.get(key, 0) <= last:
            kept.append(line)
    tmp = path.with_suffix(".jsonl.tmp")  # a kill mid-rewrite must not lose the log
    tmp.write_text("".join(f"{line}\n" for line in kept))
    os.replace(tmp, path)


class MetricsLog:
    """Appends one JSON object per step to `metrics.jsonl`, flushed at once so a crash loses nothing.

    On resume, rows after the checkpoint's step are dropped so no step appears twice.
    """

    def __init__(self, path: str | Path, resume_from_step: int | None = None, key: str = "step"):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_from_step is None:
            self.path.write_text("")
        else:
            keep_rows_through(self.path, key, resume_from_step)

    def write(self, row: dict) -> None:
        try:
            with self.path.open("a") as f:
                f.write(json.dumps(_plain(row)) + "\n")
                f.flush()
        except OSError as err:  # a full disk: one line naming the file, not a traceback
            from lmpo.trainers.fs_faults import fs_error
            from lmpo.trainers.run_dir import RunDirError

            raise RunDirError(f"{fs_error(self.path, err)}; the newest complete checkpoint in {self.path.parent} "
                              f"is intact and `--resume {self.path.parent}` continues from it") from err


def _plain(row: dict) -> dict:
    out = {}
    for key, value in row.items():
        if isinstance(value, torch.Tensor):
            value = value.item()
        if isinstance(value, float) and not math.isfinite(value):
            value = str(value)
        out[key] = value
    return out


def options_for(fn, available: dict) -> dict:
    """The keyword options `fn` accepts, taken from `available` (config values by name), so
    that every registered function of a family is called the same way."""
    import inspect

    params = inspect.signature(fn).parameters
    return {k: v for k, v in available.items() if k in params}


@contextmanager
def preserved_rng():
    """Python's and torch's random states (CPU, and every CUDA device in use) as they were on entry."""
    state = random.getstate()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(state)
