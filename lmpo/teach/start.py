"""The common starting point of the teaching commands: a task's SFT checkpoint, made once.

`lmpo compare`, `lmpo factcheck` and `lmpo exercise train` all start their RL or DPO runs from
the same SFT model; this trains CPT → SFT with the pipeline's settings for the task (exactly
what `lmpo pipeline` would run before its last stage) and reuses the result on later calls."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from lmpo.trainers.pipeline import PipelineConfig, resolve_pipeline
from lmpo.trainers.supervised import train_cpt, train_sft

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
    unless a finished one is in `cache`. A run killed midway is started again from scratch."""
    safe_task = "".join(c if c.isalnum() or c in "-_=" else "_" for c in task)
    directory = Path(cache or default_cache()) / f"{safe_task}-{model}-seed{seed}"
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f".{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second caller waits for the first one's checkpoint
        return _cached(directory) or _train(directory, task, seed, threads, model, quiet)


def _cached(directory: Path) -> StartPoint | None:
    done = directory / DONE
    if done.is_file():
        saved = json.loads(done.read_text())
        if Path(saved["model_dir"]).is_dir():
            return StartPoint(**saved)
    return None


def _train(directory: Path, task: str, seed: int, threads: int, model: str, quiet: bool) -> StartPoint:
    if directory.exists():  # an unfinished earlier attempt
        shutil.rmtree(directory)
    done = directory / DONE
    cfg = resolve_pipeline(PipelineConfig(out=str(directory), task=task, seed=seed, threads=threads, model=model,
                                         adaptive=False))
    shared = {"task": task, "seed": seed, "threads": threads, "device": cfg.device, "precision": cfg.precision}
    if not quiet:
        print(f"[start] training the {task} SFT checkpoint for seed {seed} (once; kept in {directory})")
    cpt = train_cpt(replace(cfg.cpt, model=model, out=str(directory / "cpt"), **shared))
    sft = train_sft(replace(cfg.sft, model=cpt.model_dir, out=str(directory / "sft"), **shared))
    point = StartPoint(model_dir=sft.model_dir, sft_accuracy=float(sft.accuracy or 0.0),
                       cpt_accuracy=float(cpt.accuracy or 0.0), seconds=cpt.seconds + sft.seconds,
                       directory=str(directory))
    done.write_text(json.dumps(point.__dict__, indent=2))
    return point
