"""Experiment trackers beside the metrics file that always exists: TensorBoard, Weights &
Biases, trackio — each an optional package, imported only when asked for.

Each tracker receives the numeric fields of every metrics row, keyed by the row's `step`.
A tracker that is asked for but not installed is an error before training starts, naming the
package to install, never a silent no-op.

`--resume` continues the interrupted run's tracker run rather than opening another: the W&B run
id is kept in the run directory (`trackers.json`) and passed back with `resume="allow"`; trackio
resumes the run of the same name (`resume="allow"`); TensorBoard's writer is opened with
`purge_step` just after the checkpoint, hiding what the interrupted process logged after it.

W&B and trackio cannot replace a step they hold (W&B drops a step below its last, warning
"Step must only increase in log calls"): the highest step sent to each is kept in `trackers.json`
too, and a resumed run sends them only the steps after it. The steps between the checkpoint and
the interruption keep the interrupted process's values there (metrics.jsonl has the resumed run's).
"""

from __future__ import annotations

import json
import math
import secrets
import string
import sys
from pathlib import Path

KNOWN = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}
IDS_FILE = "trackers.json"
"""In the run directory: the tracker run ids a `--resume` continues (W&B's), and the last step
sent to each tracker run that cannot replace one (`LAST_STEPS`)."""

LAST_STEPS = "last_step"
"""The key of `trackers.json` under which the highest step sent to each tracker run is kept."""

APPEND_ONLY = ("wandb", "trackio")
"""Trackers that cannot replace a step they hold: a resumed run does not send them one again."""


class Trackers:
    def __init__(self, sinks: list, names: list[str] | None = None, run_dir: Path | None = None,
                 sent: dict[str, int] | None = None):
        self.sinks = sinks
        self.names = names or [""] * len(sinks)
        self.run_dir = run_dir
        self.held = dict(sent or {})  # what the tracker runs held when this process opened them
        self.sent = dict(self.held)  # the highest step each append-only tracker run holds now

    @classmethod
    def start(cls, spec: str, run_dir: Path, name: str, config: dict, resume: bool = False) -> "Trackers | None":
        """Open the trackers `spec` names; with `resume`, continue the run directory's tracker runs."""
        names = [n.strip() for n in spec.split(",") if n.strip()]
        if not names:
            return None
        unknown = [n for n in names if n not in KNOWN]
        if unknown:
            raise ValueError(f"report_to: unknown tracker(s) {unknown}; choose from {', '.join(KNOWN)}")
        sinks = [_open(n, run_dir, name, config, resume) for n in names]
        return cls(sinks, names, run_dir, _sent_steps(run_dir, names, resume))

    def resumed_from(self, step: int | None) -> None:
        """The run continues after the checkpoint of `step` (None: a fresh run): what the interrupted
        process logged after it is logged again to TensorBoard, which hides its first copy (W&B and
        trackio keep theirs: `write` does not send those steps again)."""
        if step is None:
            return
        for sink in self.sinks:
            if isinstance(sink, _TensorBoard):
                sink.purge_step = step + 1

    def write(self, row: dict) -> None:
        step = int(row.get("step", 0))
        scalars = {k: float(v) for k, v in row.items()
                   if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        for name, sink in zip(self.names, self.sinks):
            if step <= self.held.get(name, -1):  # the interrupted process sent it: the tracker run has it
                continue
            sink.log(scalars, step)
            if name in APPEND_ONLY and step > self.sent.get(name, -1):
                self.sent[name] = step
                _keep_sent_steps(self.run_dir, self.sent)

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


def _open(name: str, run_dir: Path, stage: str, config: dict, resume: bool):
    if name == "tensorboard":
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise _missing(name) from err
        return _TensorBoard(SummaryWriter, run_dir / "tensorboard")
    module = _import(name)
    options = {"resume": "allow"} if resume else {}  # trackio: the run of the same name (the run dir's)
    if name == "wandb":
        options = {"dir": str(run_dir), "id": _run_id(run_dir, name, resume), **options}
    run = module.init(project="lmpo", name=f"{run_dir.name}-{stage}", config=config, **options)
    return _LogCall(module, run)


def _run_id(run_dir: Path, name: str, resume: bool) -> str:
    """The tracker run id kept in the run directory: the interrupted run's with `resume`, else a new one."""
    ids = _read_ids(run_dir)
    if resume and isinstance(ids.get(name), str) and ids[name]:
        return ids[name]
    alphabet = string.ascii_lowercase + string.digits
    ids[name] = "".join(secrets.choice(alphabet) for _ in range(8))  # W&B's own id shape
    if isinstance(ids.get(LAST_STEPS), dict):  # a new tracker run holds no step yet
        ids[LAST_STEPS].pop(name, None)
    _write_ids(run_dir, ids)
    return ids[name]


def _read_ids(run_dir: Path) -> dict:
    try:
        ids = json.loads((run_dir / IDS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return ids if isinstance(ids, dict) else {}


def _write_ids(run_dir: Path, ids: dict) -> None:
    path = run_dir / IDS_FILE
    tmp = path.with_name(f"{IDS_FILE}.tmp")  # a kill mid-write must not lose the run id
    tmp.write_text(json.dumps(ids, indent=2))
    tmp.replace(path)


def _sent_steps(run_dir: Path, names: list[str], resume: bool) -> dict[str, int]:
    """The highest step the interrupted process sent to each append-only tracker run this one
    continues; a fresh run (or a tracker it did not use) starts from nothing."""
    ids = _read_ids(run_dir)
    if not resume:
        if LAST_STEPS in ids:  # a new run in the directory: the old tracker runs' steps are not its own
            _write_ids(run_dir, {k: v for k, v in ids.items() if k != LAST_STEPS})
        return {}
    held = ids.get(LAST_STEPS)
    if not isinstance(held, dict):
        return {}
    return {name: step for name, step in held.items()
            if name in names and name in APPEND_ONLY and isinstance(step, int) and not isinstance(step, bool)}


def _keep_sent_steps(run_dir: Path | None, sent: dict[str, int]) -> None:
    if run_dir is None:
        return
    ids = _read_ids(run_dir)
    kept = ids.get(LAST_STEPS) if isinstance(ids.get(LAST_STEPS), dict) else {}
    _write_ids(run_dir, {**ids, LAST_STEPS: {**kept, **sent}})


def _import(name: str):
    try:
        return __import__(name)
    except ImportError as err:
        raise _missing(name) from err


class _TensorBoard:
    """The writer opens at the first row, once a resumed run has said where its checkpoint was."""

    def __init__(self, writer_class, log_dir: Path):
        self.writer_class, self.log_dir = writer_class, log_dir
        self.writer = None
        self.purge_step: int | None = None

    def log(self, scalars: dict, step: int) -> None:
        if self.writer is None:
            self.writer = self.writer_class(log_dir=str(self.log_dir), purge_step=self.purge_step)
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class _LogCall:
    """wandb and trackio share the `init` / `log(dict, step=)` / `finish` interface."""

    def __init__(self, module, run):
        self.module, self.run = module, run

    def log(self, scalars: dict, step: int) -> None:
        self.module.log(scalars, step=step)

    def close(self) -> None:
        self.module.finish()
