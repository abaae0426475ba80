"""What the experiments share: the output directory, threads, the SFT starting point, each
training stage configured as `lmpo pipeline` configures it, and runs that several claims read."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from lmpo.teach.start import StartPoint, sft_start
from lmpo.trainers.pipeline import PipelineConfig, resolve_pipeline

STAGE_SECTIONS = {"rl": "rl_stage", "dpo": "dpo", "online_dpo": "online_dpo", "rm": "rm"}


@dataclass
class Context:
    out: Path
    """The factcheck directory: runs/ (training runs), logs/ (their output), plots/."""
    threads: int = 2
    """Torch threads for training runs and computations."""
    seed: int = 0
    task: str = "sort_digits"
    model: str = "tiny"
    _cache: dict[str, Any] = field(default_factory=dict)

    def start(self) -> StartPoint:
        """The task's SFT checkpoint (trained once, then cached; see `lmpo.teach.start`)."""
        return self.once("start", lambda: sft_start(self.task, self.seed, self.threads, self.model, quiet=True))

    def once(self, key: str, make: Callable[[], Any]) -> Any:
        """`make()` the first time `key` is asked for; the same value afterwards (runs several
        claims read are trained once per factcheck)."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def run_dir(self, name: str) -> Path:
        return self.out / "runs" / name

    def stage(self, kind: str, name: str, last_stage: str = "grpo", model: str | None = None, **overrides: Any):
        """The config `lmpo pipeline --rl LAST_STAGE` gives stage `kind` (rl, dpo, online_dpo,
        rm) after SFT — defaults < task settings < preset — starting from the SFT model (or
        `model`), writing to runs/NAME, with `overrides` on top (the budgets of an experiment)."""
        cfg = resolve_pipeline(PipelineConfig(out=str(self.out / "runs"), model=self.model, task=self.task,
                                              seed=self.seed, threads=self.threads, rl=last_stage,
                                              adaptive=False))
        shared = {"task": cfg.task, "seed": cfg.seed, "threads": cfg.threads, "device": cfg.device,
                  "precision": cfg.precision}
        section = getattr(cfg, STAGE_SECTIONS[kind])
        start = model or self.start().model_dir
        return replace(section, **{"model": start, "out": str(self.run_dir(name)), **shared, **overrides})

    @contextlib.contextmanager
    def quiet(self, name: str):
        """Trainer output goes to logs/NAME.log instead of the terminal."""
        path = self.out / "logs" / f"{name}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            yield

    def log_error(self, name: str, text: str) -> None:
        path = self.out / "logs" / f"{name}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as log:
            log.write(text)
        print(f"[factcheck] {name}: see {path}", file=sys.stderr)
