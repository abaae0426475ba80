"""Data parallelism on torch.distributed, as started by `torchrun`: nothing here is home-made
communication, only the few facts every trainer needs (rank, world size, sums across ranks).

`torchrun --nproc_per_node N -m lmpo train ...` sets RANK, WORLD_SIZE and LOCAL_RANK; a run
started without them is one process and every helper here is the identity. Backend: NCCL on
CUDA, gloo on CPU (the tests run 2 CPU processes with gloo).

How a trainer uses it: every rank builds the same global batch (same seed, same order), keeps
its own contiguous shard (`shard`; `shard_batch`'s token batches may differ by a row), and
divides its loss by the global token or sequence count (`all_sum`) times `world` —
DistributedDataParallel averages gradients over ranks, so the update is exactly the
one-process update on the global batch.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
from typing import Sequence, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


def launched_rank() -> int:
    """This process's rank as torchrun set it, before any process group exists (0 alone):
    what decides who writes a file that is not a stage's (a pipeline's summary, a report)."""
    return int(os.environ.get("RANK", "0")) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else 0


def launched_world() -> int:
    """The process count torchrun set, before any process group exists (1 without torchrun)."""
    return max(int(os.environ.get("WORLD_SIZE", "1")), 1)


def equal_split_refusal(items: int, batch_size: int, world: int, what: str) -> str:
    """Why batches of `batch_size` from `items` (the last one short) do not split into equal
    shares over `world` processes, with the options that make them; '' when they do."""
    if world <= 1:
        return ""
    if batch_size % world:
        return (f"batch_size={batch_size} does not split over {world} processes; give a multiple of {world} "
                f"(e.g. --batch_size {batch_size + world - batch_size % world})")
    last = items % batch_size
    if last % world == 0:
        return ""
    fewer = items - last % world
    return (f"{items} {what} leave a last batch of {last}, which does not split over {world} processes; "
            f"train on {fewer} or {fewer + world} {what}, or choose a --batch_size that leaves a last batch "
            f"of a multiple of {world}")


def say(*args, **kwargs) -> None:
    """`print`, from rank 0 alone under torchrun: every rank loads the same files and decides
    alike, so N copies of a line say nothing more (errors stay every rank's: one may fail alone)."""
    if launched_rank() == 0:
        print(*args, **kwargs)


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    @classmethod
    def from_env(cls, use_cuda: bool) -> "Distributed":
        """Join the process group torchrun describes (once per process); one process otherwise."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        if not dist.is_initialized():
            if use_cuda:
                torch.cuda.set_device(local)
            dist.init_process_group(backend="nccl" if use_cuda else "gloo")
            atexit.register(_leave)  # once per process: later stages of a pipeline reuse the group
        return cls(rank, world, local)

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def shard(self, rows: Sequence[T], what: str = "rows") -> list[T]:
        """This rank's contiguous share of a global batch; the batch must divide evenly, so every
        rank runs the same number of steps and the mean over ranks is the global mean."""
        if len(rows) % self.world:
            raise ValueError(f"{len(rows)} {what} do not divide over {self.world} processes; "
                             f"choose a batch that is a multiple of the process count")
        return list(rows[self._span(len(rows))])

    def _span(self, n: int) -> slice:
        """Contiguous shares as equal as they go: the first n % world ranks take one more."""
        size, extra = divmod(n, self.world)
        start = self.rank * size + min(self.rank, extra)
        return slice(start, start + size + (self.rank < extra))

    def shard_batch(self, batch: tuple) -> tuple:
        """This rank's rows of a token batch (ids, loss mask, attention mask or None). The shares
        may differ by a row (a short last batch), as the loss divides by the global token count.
        A rank left without a row (fewer rows than ranks) gets the batch's first row with no
        loss: it still runs the forward and backward that DDP's gradient all-reduce and FSDP's
        gathers wait for, adding zero to the gradient."""
        if not self.active:
            return batch
        span = self._span(batch[0].size(0))
        if span.start < span.stop:
            return tuple(None if t is None else t[span] for t in batch)
        ids, mask, *rest = (None if t is None else t[:1] for t in batch)
        return (ids, torch.zeros_like(mask), *rest)

    def all_sum(self, value: float) -> float:
        """The sum of `value` over ranks (a global count: tokens, sequences)."""
        if not self.active:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item())

    def all_true(self, flag: bool) -> bool:
        return self.all_sum(0.0 if flag else 1.0) == 0.0

    def gather(self, obj: T) -> list[T]:
        """Every rank's `obj` (picklable), in rank order, on every rank."""
        if not self.active:
            return [obj]
        out: list = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: T) -> T:
        """Rank 0's `obj` on every rank."""
        if not self.active:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def close(self) -> None:
        """The end of a stage: every process waits for the others (rank 0 saves the model)."""
        if self.active and dist.is_initialized():
            dist.barrier()


def wrap_data_parallel(model: torch.nn.Module, ctx: Distributed, device: torch.device) -> torch.nn.Module:
    """The module to run loss forwards through: DistributedDataParallel when several processes
    train, the model itself otherwise. Sampling and evaluation use the unwrapped model."""
    if not ctx.active:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def unwrap(module):
    """The model inside a DistributedDataParallel wrapper (anything else as it is)."""
    from torch.nn.parallel import DistributedDataParallel

    return module.module if isinstance(module, DistributedDataParallel) else module


def _leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
