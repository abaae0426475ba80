"""Experiment trackers beside the metrics file that always exists: TensorBoard, Weights &
Biases, trackio — each an optional package, imported only when asked for.

Each tracker receives the numeric fields of every metrics row, keyed by the row's `step`.
A tracker that is asked for but not installed is an error before training starts, naming the
package to install, never a silent no-op.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

KNOWN = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}


class Trackers:
    def __init__(self, sinks: list):
        self.sinks = sinks

    @classmethod
    def start(cls, spec: str, run_dir: Path, name: str, config: dict) -> "Trackers | None":
        names = [n.strip() for n in spec.split(",") if n.strip()]
        if not names:
            return None
        unknown = [n for n in names if n not in KNOWN]
        if unknown:
            raise ValueError(f"report_to: unknown tracker(s) {unknown}; choose from {', '.join(KNOWN)}")
        return cls([_open(n, run_dir, name, config) for n in names])

    def write(self, row: dict) -> None:
        step = int(row.get("step", 0))
        scalars = {k: float(v) for k, v in row.items()
                   if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        for sink in self.sinks:
            sink.log(scalars, step)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def tracker_problems(spec: str) -> list[str]:
    """`--report_to` names that are unknown or whose package is not installed, said before the run
    directory is made (importing them is left to `Trackers.start`)."""
    import importlib.util

    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in KNOWN]
    if unknown:
        return [f"report_to: unknown tracker(s) {unknown}; choose from {', '.join(KNOWN)}"]
    def installed(package: str) -> bool:
        if package in sys.modules:  # imported already (or blocked: None)
            return sys.modules[package] is not None
        return importlib.util.find_spec(package) is not None

    return [str(_missing(n)) for n in names if not installed(KNOWN[n])]


def _missing(name: str) -> ImportError:
    return ImportError(f"report_to={name}: the {KNOWN[name]!r} package is not installed; "
                       f"`pip install {KNOWN[name]}` in this environment, or drop it from --report_to")


def _open(name: str, run_dir: Path, stage: str, config: dict):
    if name == "tensorboard":
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise _missing(name) from err
        return _TensorBoard(SummaryWriter(log_dir=str(run_dir / "tensorboard")))
    module = _import(name)
    run = module.init(project="lmpo", name=f"{run_dir.name}-{stage}", config=config,
                      **({"dir": str(run_dir)} if name == "wandb" else {}))
    return _LogCall(module, run)


def _import(name: str):
    try:
        return __import__(name)
    except ImportError as err:
        raise _missing(name) from err


class _TensorBoard:
    def __init__(self, writer):
        self.writer = writer

    def log(self, scalars: dict, step: int) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _LogCall:
    """wandb and trackio share the `init` / `log(dict, step=)` / `finish` interface."""

    def __init__(self, module, run):
        self.module, self.run = module, run

    def log(self, scalars: dict, step: int) -> None:
        self.module.log(scalars, step=step)

    def close(self) -> None:
        self.module.finish()
