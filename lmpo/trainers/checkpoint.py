"""Checkpoints that survive a crash: written to a temporary directory, completed by a marker
file written last, then published with an atomic rename. A directory without the marker is
never loaded; the newest complete checkpoint is never deleted before a newer one is complete.

Layout of `RUN_DIR/checkpoints/step_000100/`: the model as an ordinary Hugging Face directory
(safetensors) with its tokenizer, `critic.safetensors` when there is one, `optimizer.pt` and `scheduler.pt` (loaded with
`weights_only=True`), `rng.pt` (torch generator states), `state.json` (step, data position,
Python's random state), and `COMPLETE`.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, load_model, save_model

MARKER = "COMPLETE"


@dataclass
class Resumed:
    step: int
    state: dict


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return None
    done = sorted(p for p in root.glob("step_*") if (p / MARKER).exists())
    return done[-1] if done else None


def save_checkpoint(run_dir: str | Path, step: int, model, tokenizer, optimizer, scheduler,
                    generators: dict[str, torch.Generator], state: dict, keep_last: int = 2,
                    extra_modules: dict[str, torch.nn.Module] | None = None) -> Path:
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp-step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    for name, module in (extra_modules or {}).items():
        save_model(module, str(tmp / f"{name}.safetensors"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    rng = {"torch": torch.get_rng_state(), **{f"gen_{k}": g.get_state() for k, g in generators.items()}}
    torch.save(rng, tmp / "rng.pt")
    full_state = {**state, "step": step, "python_random": _jsonable(random.getstate())}
    (tmp / "state.json").write_text(json.dumps(full_state))
    (tmp / MARKER).write_text("ok\n")
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    _prune(root, keep_last)
    return final


def load_checkpoint(path: Path, model, optimizer, scheduler, generators: dict[str, torch.Generator],
                    extra_modules: dict[str, torch.nn.Module] | None = None) -> Resumed:
    if not (path / MARKER).exists():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {MARKER} marker)")
    weights = {}
    for file in sorted(path.glob("model*.safetensors")):  # the policy; extra modules have their own files
        weights.update(load_file(file))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # tied weights are stored once; anything else missing means a different model
    missing = [k for k in missing if k not in _tied_keys(model)]
    if missing or unexpected:
        raise ValueError(f"checkpoint {path} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for name, module in (extra_modules or {}).items():
        load_model(module, str(path / f"{name}.safetensors"))
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    rng = torch.load(path / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["torch"])
    for name, gen in generators.items():
        gen.set_state(rng[f"gen_{name}"])
    state = json.loads((path / "state.json").read_text())
    random.setstate(_tupled(state.pop("python_random")))
    return Resumed(step=state["step"], state=state)


def _tied_keys(model) -> set[str]:
    if getattr(model.config, "tie_word_embeddings", False):
        return {"lm_head.weight"}
    return set()


def _prune(root: Path, keep_last: int) -> None:
    done = sorted(p for p in root.glob("step_*") if (p / MARKER).exists())
    for old in done[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-step_*"):
        shutil.rmtree(stale, ignore_errors=True)


def _jsonable(obj):
    return [_jsonable(x) for x in obj] if isinstance(obj, (tuple, list)) else obj


def _tupled(obj):
    return tuple(_tupled(x) for x in obj) if isinstance(obj, list) else obj
