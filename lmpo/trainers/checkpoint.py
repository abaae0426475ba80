"""Checkpoints that survive a crash: written to a temporary directory, completed by a marker
file written last, then published with an atomic rename. A directory without the marker is
never loaded; the newest complete checkpoint is never deleted before a newer one is complete.

Layout of `RUN_DIR/checkpoints/step_000100/`: the model as an ordinary Hugging Face directory
(safetensors) with its tokenizer, `critic.safetensors` when there is one, `optimizer.pt` and `scheduler.pt` (loaded with
`weights_only=True`), `rng.pt` (torch generator states), `data.pt` (the data order's state,
when the trainer has one), `state.json` (step, data position, Python's random state, the
options, and the data files' fingerprints: `lmpo.trainers.inputs`), and
`COMPLETE`. Resuming removes what a crash left behind: temporary directories and any
directory without the marker.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, load_model, save_model as save_module
from transformers import PreTrainedModel

from lmpo.models import save_model, saved_state_dict

from lmpo.trainers.faults import fault_point
from lmpo.trainers.inputs import check_same_inputs, input_fingerprints
from lmpo.trainers.option_paths import absolute_paths, started_in
from lmpo.trainers.resume_changes import cap_switch_problem, extension_problem, length_option
from lmpo.trainers.run_dir import MARKER, checkpoint_dir, complete_checkpoints

SHARDED = "sharded"  # an FSDP run's weights and optimizer state: a distributed checkpoint
# Options that may differ between a run and its resumption without changing what it trains: where
# and how often it saves, and how a step is computed (threads, and the memory options that split
# or recompute the same sums; these change only the float rounding, like the thread count); and the
# wall-time cap, which says only where the run stops (`cap_switch_problem`: where it is a stopping rule's).
RESUME_MAY_CHANGE = frozenset({"out", "resume", "overwrite", "save_every", "keep_checkpoints", "threads", "log_every",
                               "max_unscorable_steps", "reward_memory_mb", "gradient_checkpointing",
                               "logprob_chunk_tokens", "micro_batch_size", "micro_batch_tokens", "max_minutes"})


@dataclass
class Resumed:
    step: int
    state: dict
    data: dict | None = None


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run being resumed; what a crash left incomplete is removed."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return None
    for leftover in [*root.glob(".tmp-step_*"), *root.glob(".old-step_*"),
                     *(p for p in root.glob("step_*") if not (p / MARKER).exists())]:
        print(f"[checkpoint] removing incomplete {leftover}")
        shutil.rmtree(leftover, ignore_errors=True)
    done = sorted(p for p in root.glob("step_*") if (p / MARKER).exists())
    return done[-1] if done else None


def save_checkpoint(run_dir: str | Path, step: int, model, tokenizer, optimizer, scheduler,
                    generators: dict[str, torch.Generator], state: dict, keep_last: int = 2,
                    extra_modules: dict[str, torch.nn.Module] | None = None, data_state: dict | None = None,
                    rank_rng: list[dict] | None = None, sharded: bool = False) -> Path:
    """`rank_rng`: every process's generator states (data-parallel runs), each rank resumes its own.
    `sharded`: every process has already written its weight and optimizer shards into the
    temporary directory (`sharded_checkpoint_dir`); this completes the checkpoint around them."""
    modules = [] if sharded else [model, *(extra_modules or {}).values()]
    if not all(bool(torch.isfinite(p).all()) for m in modules for p in m.parameters()):
        raise RuntimeError(f"step {step}: the weights are not finite; refusing to write them as a checkpoint")
    root = checkpoint_dir(run_dir)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp-step_{step:06d}"
    try:
        return _write_checkpoint(root, final, tmp, step, model, tokenizer, optimizer, scheduler, generators, state,
                                 keep_last, extra_modules, data_state, rank_rng, sharded)
    except Exception as err:  # noqa: BLE001 - only write failures are translated; the rest is re-raised
        from lmpo.trainers.fs_faults import fs_error
        from lmpo.trainers.run_dir import RunDirError

        if not is_write_failure(err):
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # what was written of this one is useless, and takes space
        raise RunDirError(f"step {step}: {fs_error(final, err)}; {resume_advice(run_dir, 'previous')}") from err


def is_write_failure(err: BaseException) -> bool:
    """A failed write (an OSError, or a full disk as torch.save and safetensors report it)."""
    from lmpo.trainers.fs_faults import is_disk_full

    return isinstance(err, OSError) or is_disk_full(err)


def resume_advice(run_dir: str | Path, which: str) -> str:
    """After a failed write: the newest intact checkpoint and the command that continues from it."""
    root = checkpoint_dir(run_dir)
    done = sorted(p for p in root.glob("step_*") if (p / MARKER).exists()) if root.is_dir() else []
    if done:
        return f"the {which} checkpoint {done[-1]} is intact and `--resume {run_dir}` continues from it"
    return f"no earlier checkpoint exists, so `--resume {run_dir}` would start over"


def _write_checkpoint(root: Path, final: Path, tmp: Path, step: int, model, tokenizer, optimizer, scheduler,
                      generators, state, keep_last, extra_modules, data_state, rank_rng=None, sharded=False) -> Path:
    if sharded:  # the processes' shards are in tmp/sharded already
        tokenizer.save_pretrained(tmp)
    else:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        save_model(model, tokenizer, tmp)  # a LoRA model: its adapter (the frozen base is the run's start)
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    for name, module in (extra_modules or {}).items():
        save_module(module, str(tmp / f"{name}.safetensors"))
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    rng = {"torch": torch.get_rng_state(), **{f"gen_{k}": g.get_state() for k, g in generators.items()}}
    torch.save({"ranks": rank_rng} if rank_rng else rng, tmp / "rng.pt")
    if data_state is not None:
        torch.save(data_state, tmp / "data.pt")
    full_state = {**state, "step": step, "python_random": _jsonable(random.getstate())}
    (tmp / "state.json").write_text(json.dumps(full_state))
    fault_point("checkpoint_write", step)
    (tmp / MARKER).write_text("ok\n")
    if final.exists():
        _remove(final)
    tmp.rename(final)
    _prune(root, keep_last)
    return final


def load_checkpoint(path: Path, model, optimizer, scheduler, generators: dict[str, torch.Generator],
                    extra_modules: dict[str, torch.nn.Module] | None = None, rank: int = 0) -> Resumed:
    if not (path / MARKER).exists():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {MARKER} marker)")
    rng = _read(path / "rng.pt", _torch_load)
    written, world = len(rng["ranks"]) if "ranks" in rng else 1, _world_size()
    if written != world:  # each process's random state is its own: another count would follow neither run
        raise ValueError(f"checkpoint {path} was written by {written} process{'es' if written > 1 else ''}; resume "
                         f"it with {'one' if written == 1 else f'as many (torchrun --nproc_per_node {written})'}, "
                         f"not {world}")
    if (path / SHARDED).is_dir():
        from lmpo.trainers.fsdp import load_sharded

        load_sharded(model, optimizer, path / SHARDED)
    else:
        load_weights(path, model)
        optimizer.load_state_dict(_read(path / "optimizer.pt", _torch_load))
    for name, module in (extra_modules or {}).items():
        _read(path / f"{name}.safetensors", lambda file: load_model(module, str(file)))
    scheduler.load_state_dict(_read(path / "scheduler.pt", _torch_load))
    if "ranks" in rng:
        rng = rng["ranks"][rank]
    torch.set_rng_state(rng["torch"])
    for name, gen in generators.items():
        gen.set_state(rng[f"gen_{name}"])
    state = _read(path / "state.json", _json_load)
    random.setstate(_tupled(state.pop("python_random")))
    data = _read(path / "data.pt", _torch_load) if (path / "data.pt").exists() else None
    return Resumed(step=state["step"], state=state, data=data)


def _world_size() -> int:
    """Processes in this run: torch.distributed's world when it is set up, else 1."""
    distributed = torch.distributed
    return distributed.get_world_size() if distributed.is_available() and distributed.is_initialized() else 1


class DamagedCheckpoint(ValueError):
    """A file of a complete checkpoint that cannot be read (truncated, emptied, deleted since)."""


def _read(file: Path, load):
    """`load(file)`, a failure to read it named by the file (safetensors, torch and json name none)."""
    try:
        return load(file)
    except FileNotFoundError:
        raise DamagedCheckpoint(f"{file} is missing") from None
    except Exception as err:  # each reader raises its own kinds: SafetensorError, UnpicklingError, EOFError...
        cause = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DamagedCheckpoint(f"{file} cannot be read ({cause})") from None


def checkpoint_state(out: str | Path, path: Path) -> dict:
    """The `state.json` of run `out`'s checkpoint `path` (its options, step, data position)."""
    try:
        return _read(path / "state.json", _json_load)
    except DamagedCheckpoint as err:
        raise _damaged(out, path, err) from None


def _damaged(out: str | Path, path: Path, err: DamagedCheckpoint) -> DamagedCheckpoint:
    older = [p for p in complete_checkpoints(out) if p.name < path.name]
    way = f"to resume from {older[-1].name}" if older else "to start from the beginning"
    return DamagedCheckpoint(f"--resume {out}: its newest checkpoint is damaged: {err}; move it aside "
                             f"(mv {path} {path.with_name(f'damaged-{path.name}')}) {way}")


def _torch_load(file: Path):
    return torch.load(file, weights_only=True)


def _json_load(file: Path) -> dict:
    return json.loads(file.read_text())


def sharded_checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    """The emptied temporary directory of step `step`'s checkpoint, where every process of a
    sharded (FSDP) run writes its shards into `SHARDED` before `save_checkpoint(..., sharded=True)`."""
    root = checkpoint_dir(run_dir)
    tmp = root / f".tmp-step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def load_weights(path: Path, model) -> None:
    """The weights of a model directory (or a LoRA adapter) saved by lmpo, into `model`."""
    if hasattr(model, "peft_config"):  # a LoRA run's checkpoint holds the adapter (the base is frozen)
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, _read(path / "adapter_model.safetensors", load_file))
        if getattr(result, "unexpected_keys", None):
            raise ValueError(f"checkpoint {path} does not match the adapter: unexpected {result.unexpected_keys[:5]}")
        return
    weights = {}
    for file in sorted(path.glob("model*.safetensors")):  # the policy; extra modules have their own files
        weights.update(_read(file, load_file))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if (missing or unexpected) and isinstance(model, PreTrainedModel):  # saved under transformers' other names
        missing, unexpected = model.load_state_dict(saved_state_dict(model, path), strict=False)
    # tied weights are stored once; anything else missing means a different model
    missing = [k for k in missing if k not in _tied_keys(model)]
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")


def resume_training(cfg, out: Path, name: str, model, optimizer, scheduler,
                    generators: dict[str, torch.Generator] | None = None,
                    extra_modules: dict[str, torch.nn.Module] | None = None, rank: int = 0) -> Resumed | None:
    """For a config with `resume`: load the newest complete checkpoint in `out` into the model,
    optimizer, scheduler and generators, after checking the options and data files match the
    interrupted run's. None when not resuming or when no checkpoint was completed (start afresh)."""
    if not cfg.resume:
        return None
    path = latest_checkpoint(out)
    if path is None:
        if rank == 0:
            print(f"[{name}] no complete checkpoint in {out}; starting from the beginning")
        return None
    saved = checkpoint_state(out, path)
    check_same_config(saved.get("config", {}), json.loads(json.dumps(asdict(cfg))), out)
    check_same_inputs(saved.get("inputs"), input_fingerprints(cfg), out)
    try:
        resumed = load_checkpoint(path, model, optimizer, scheduler, generators or {}, extra_modules, rank)
    except DamagedCheckpoint as err:
        raise _damaged(out, path, err) from None
    if rank == 0:
        print(f"[{name}] resumed from {path} at step {resumed.step}")
    return resumed


def check_resume_inputs(cfg) -> None:
    """With `--resume`: the options and the data files against the newest complete checkpoint's,
    before the data and the model load (`resume_training` checks them again when it loads that
    checkpoint), so that an edited file is said at once, not after a reference pass over it."""
    path = latest_checkpoint(cfg.resume) if getattr(cfg, "resume", "") else None
    if path is None:
        return
    saved = checkpoint_state(cfg.resume, path)
    check_same_config(saved.get("config", {}), json.loads(json.dumps(asdict(cfg))), cfg.resume)
    check_same_inputs(saved.get("inputs"), input_fingerprints(cfg), cfg.resume)


def check_same_config(saved: dict, current: dict, run_dir: str | Path) -> None:
    """A resumed run must train what the interrupted one did; only `RESUME_MAY_CHANGE` may differ
    (in a pipeline's stage sections too: `rl_stage.save_every`)."""
    # each side's relative paths from its own directory: a resume from elsewhere names the same files
    saved_files = _dotted(absolute_paths(saved, started_in(run_dir) or os.getcwd()) if run_dir else saved)
    current_files = _dotted(absolute_paths(current, os.getcwd()) if run_dir else current)
    saved, current = _dotted(saved), _dotted(current)  # as given, to name them
    changed = sorted(k for k in saved.keys() | current.keys()
                     if k.rpartition(".")[2] not in RESUME_MAY_CHANGE and saved_files.get(k) != current_files.get(k)
                     and not _picked_alike(k, saved, current))
    if switched := cap_switch_problem(saved, current):
        raise ValueError(f"--resume {run_dir}: {switched}")
    length = length_option(saved)  # --steps, --epochs, --rounds
    if length in changed and (why := extension_problem(saved, current)) is None:
        changed.remove(length)  # trained further: what the steps so far computed is the same
    elif length in changed and why:
        model = f"--model {Path(run_dir) / 'model'}"
        then = (f"that run finished, so to train further start a new run from its model ({model})"
                if (Path(run_dir) / "result.json").is_file() else
                f"to train further, finish this run with its --{length} {saved[length]}, then start a new run from "
                f"its model ({model})")
        others = [k for k in changed if k != length]  # said too: fixing the length alone would meet them next
        also = f"; other options differ too: {_parts(others, saved, current)}" if others else ""
        raise ValueError(f"--resume {run_dir}: {why}; {then}{also}")
    if changed:
        parts = _parts(changed, saved, current)
        if (Path(run_dir) / "result.json").is_file():  # a finished run goes on only as resume_changes allows
            raise ValueError(f"--resume {run_dir}: options differ from the run's: {parts}; that run finished, so "
                             f"to train its model further start a new run from it (--model {Path(run_dir) / 'model'})")
        raise ValueError(f"--resume {run_dir}: options differ from the interrupted run: {parts}; "
                         f"repeat the run's own options")


def _parts(keys: list[str], saved: dict, current: dict) -> str:
    return ", ".join(f"{k}={current.get(k)!r} ({_was(k, saved.get(k))})" for k in keys)


# options whose 0 is "the task's own": a run started without them recorded 0, not the task's value
TASK_OWN_WHEN_ZERO = ("max_turns", "max_turn_tokens")


def _was(key: str, value) -> str:
    name = key.rpartition(".")[2]
    if name in TASK_OWN_WHEN_ZERO and value == 0:
        return f"was 0, the task's own: leave --{name} out"
    return f"was {value!r}"


def _picked_alike(key: str, saved: dict, current: dict) -> bool:
    """`auto` and what it picks on this machine are one choice: `--device cpu` or `--precision fp32`
    resumes a run started with the defaults on a CPU."""
    import warnings

    from lmpo.models import choose_precision, resolve_device

    section, _, name = key.rpartition(".")
    if name not in ("device", "precision") or not all(isinstance(d.get(key), str) for d in (saved, current)):
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # bf16 where it would be emulated: fp32, said when the run starts
            if name == "device":
                return resolve_device(saved[key]) == resolve_device(current[key])
            device = resolve_device(str(current.get(f"{section}.device" if section else "device", "auto")))
            return (choose_precision(device, saved[key]).autocast_dtype
                    == choose_precision(device, current[key]).autocast_dtype)
    except ValueError:
        return False


def _dotted(options: dict) -> dict:
    """A pipeline's stage sections (the only options that are mappings) as dotted options:
    `rl_stage.lr`, so that each is compared, and named, on its own."""
    out = {}
    for key, value in options.items():
        if isinstance(value, dict):
            out.update({f"{key}.{inner}": v for inner, v in value.items()})
        else:
            out[key] = value
    return out


def _tied_keys(model) -> set[str]:
    if getattr(model.config, "tie_word_embeddings", False):
        return {"lm_head.weight"}
    return set()


def _prune(root: Path, keep_last: int) -> None:
    done = sorted(p for p in root.glob("step_*") if (p / MARKER).exists())
    for old in done[:-keep_last] if keep_last > 0 else []:
        _remove(old)
    for stale in [*root.glob(".tmp-step_*"), *root.glob(".old-step_*")]:
        shutil.rmtree(stale, ignore_errors=True)


def _remove(checkpoint: Path) -> None:
    """Delete a checkpoint; renamed aside first (atomic) so a crash while deleting never leaves a
    half-deleted directory that still has its marker."""
    aside = checkpoint.parent / f".old-{checkpoint.name}"
    shutil.rmtree(aside, ignore_errors=True)
    checkpoint.rename(aside)
    shutil.rmtree(aside, ignore_errors=True)


def _jsonable(obj):
    return [_jsonable(x) for x in obj] if isinstance(obj, (tuple, list)) else obj


def _tupled(obj):
    return tuple(_tupled(x) for x in obj) if isinstance(obj, list) else obj
