"""The common starting point of the teaching commands: a task's SFT checkpoint, made once.

`lmpo compare`, `lmpo factcheck` and `lmpo exercise train` all start their RL or DPO runs from
the same SFT model; this trains CPT → SFT with the pipeline's settings for the task (exactly
what `lmpo pipeline` would run before its last stage) and reuses the result on later calls, as
long as it was trained with the same settings: after an upgrade of lmpo that changes them, it is
trained again rather than silently reused."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from lmpo.models import check_model_source
from lmpo.trainers.pipeline import PipelineConfig, resolve_pipeline
from lmpo.trainers.supervised import CPTConfig, SFTConfig, train_cpt, train_sft

DONE = "start.json"


@dataclass
class StartPoint:
    """A finished CPT → SFT run: where the SFT model is and how well each stage did."""

    model_dir: str
    sft_accuracy: float
    cpt_accuracy: float
    seconds: float
    directory: str


def default_cache() -> Path:
    """Where starting checkpoints are kept: $LMPO_CACHE, else ~/.cache/lmpo/start."""
    return Path(os.environ.get("LMPO_CACHE") or Path.home() / ".cache" / "lmpo") / "start"


def sft_start(task: str = "sort_digits", seed: int = 0, threads: int = 2, model: str = "tiny",
              cache: str | Path | None = None, quiet: bool = False) -> StartPoint:
    """The SFT checkpoint of `task` for `seed`: trained now (CPT → SFT, the pipeline's settings)
    unless a finished one trained with the same settings is in `cache`. A run killed midway is
    started again from scratch."""
    check_model_source(model)  # a wrong name leaves nothing in the cache
    directory = start_directory(task, seed, model, cache)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f".{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second caller waits for the first one's checkpoint
        cpt, sft = _stages(directory, task, seed, threads, model)
        return _cached(directory, cpt, sft, quiet) or _train(directory, cpt, sft, quiet)


def start_directory(task: str, seed: int, model: str, cache: str | Path | None = None) -> Path:
    safe_task = "".join(c if c.isalnum() or c in "-_=" else "_" for c in task)
    return Path(cache or default_cache()) / f"{safe_task}-{model}-seed{seed}"


def is_cached(task: str = "sort_digits", seed: int = 0, model: str = "tiny", cache: str | Path | None = None) -> bool:
    """Whether `sft_start` would reuse a checkpoint rather than train one."""
    directory = start_directory(task, seed, model, cache)
    return _cached(directory, *_stages(directory, task, seed, 1, model), quiet=True) is not None


def _stages(directory: Path, task: str, seed: int, threads: int, model: str) -> tuple[CPTConfig, SFTConfig]:
    """The CPT and SFT stages `lmpo pipeline` runs for the task, writing under `directory`."""
    cfg = resolve_pipeline(PipelineConfig(out=str(directory), task=task, seed=seed, threads=threads, model=model,
                                         adaptive=False))
    shared = {"task": task, "seed": seed, "threads": threads, "device": cfg.device, "precision": cfg.precision}
    return (replace(cfg.cpt, model=model, out=str(directory / "cpt"), **shared),
            replace(cfg.sft, out=str(directory / "sft"), **shared))  # its model: the CPT stage's


def _settings(cpt: CPTConfig, sft: SFTConfig) -> dict:
    """What the checkpoint's weights depend on: every stage option but where it is written, the
    thread count (the same bits with 1 or 2) and the SFT stage's model (the CPT stage's output)."""
    ignored = {"out", "threads", "overwrite", "resume"}
    return {"cpt": {k: v for k, v in asdict(cpt).items() if k not in ignored},
            "sft": {k: v for k, v in asdict(sft).items() if k not in ignored | {"model"}}}


def _cached(directory: Path, cpt: CPTConfig, sft: SFTConfig, quiet: bool) -> StartPoint | None:
    done = directory / DONE
    if not done.is_file():
        return None
    saved = json.loads(done.read_text())
    settings = json.loads(json.dumps(_settings(cpt, sft)))  # as the file holds them
    if saved.get("settings") != settings:
        if not quiet:
            changed = _changed(saved.get("settings"), settings)
            print(f"[start] the cached checkpoint in {directory} was trained with other settings "
                  f"({changed}); training it again")
        return None
    if not Path(saved["model_dir"]).is_dir():
        return None
    return StartPoint(**{k: saved[k] for k in StartPoint.__dataclass_fields__})


def _changed(saved: dict | None, current: dict) -> str:
    if not saved:
        return "not recorded: trained by an earlier lmpo"
    diffs = [f"{stage}.{key} {saved.get(stage, {}).get(key)!r} → {value!r}"
             for stage, options in current.items() for key, value in options.items()
             if saved.get(stage, {}).get(key) != value]
    return ", ".join(diffs[:3]) + (f" and {len(diffs) - 3} more" if len(diffs) > 3 else "")


def _train(directory: Path, cpt_cfg: CPTConfig, sft_cfg: SFTConfig, quiet: bool) -> StartPoint:
    if directory.exists():  # an unfinished earlier attempt, or one trained with other settings
        shutil.rmtree(directory)
    if not quiet:
        print(f"[start] training the {cpt_cfg.task} SFT checkpoint for seed {cpt_cfg.seed} (once; kept in {directory})")
    cpt = train_cpt(cpt_cfg)
    sft = train_sft(replace(sft_cfg, model=cpt.model_dir))
    point = StartPoint(model_dir=sft.model_dir, sft_accuracy=float(sft.accuracy or 0.0),
                       cpt_accuracy=float(cpt.accuracy or 0.0), seconds=cpt.seconds + sft.seconds,
                       directory=str(directory))
    (directory / DONE).write_text(json.dumps({**point.__dict__, "settings": _settings(cpt_cfg, sft_cfg)}, indent=2))
    return point
