"""The offline trainers' reference log-prob pass (one forward per batch before step 1), stoppable.

On a large file the pass takes minutes. `--max_minutes`, SIGTERM and Ctrl-C stop it at a batch
boundary, with one line, instead of only after step 1 (the cap, SIGTERM) or with a traceback.
What it computed is kept in `RUN_DIR/reference_logps.pt` (saved as it goes too, for a SIGKILL):
a few floats per example, written in milliseconds, where recomputing costs a forward of the model
per batch; `--resume RUN` loads it and scores only the batches not yet done. A run that
checkpoints keeps the whole pass there too, so a resume from a checkpoint does not repeat it, and
scores with the very numbers the interrupted run trained with (a resume may change the thread
count, which changes the rounding). One process only: under torchrun each process scores its own share, recomputed on resume.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Callable

import torch

from lmpo.trainers.faults import fault_point
from lmpo.trainers.harness import budget_line
from lmpo.trainers.inputs import DATA_OPTIONS, MODEL_OPTIONS, input_fingerprints
from lmpo.trainers.preemption import stop_requested
from lmpo.trainers.run_clock import STATE_KEY
from lmpo.trainers.run_dir import complete_checkpoints

FILE = "reference_logps.pt"


class StoppedBeforeTraining(Exception):
    """The run stopped in its reference pass (its cap, or SIGTERM: `code` 143), before any step."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code

    def going_on(self, command: str) -> str:
        """How to go on, given the command that resumes the run (`lmpo train dpo --resume RUN`)."""
        more = " with a larger --max_minutes (it counts the time spent here) or 0" if self.code != 143 else ""
        return f"`{command}`{more} goes on from there"


@torch.no_grad()
def stoppable_reference_pass(run, model, batches: list, score: Callable) -> list:
    """`score(model, batch)` of every batch, from where a saved partial pass left off (see the module
    docstring); the caller has put `model` in eval mode and autocast on."""
    path, keep = run.out / FILE, not run.dist.active
    out = _saved(run, path, len(batches)) if keep and run.cfg.resume else []
    max_minutes = getattr(run.cfg, "max_minutes", 0)
    if out:
        run.say(f"reference log-probs of {len(out)} of {len(batches)} batches read from {path}")
    # no checkpoint yet (it comes after a whole pass) to say the time before; one of a run given more
    # --epochs says it when it loads
    if 0 < len(out) < len(batches) and not complete_checkpoints(run.out):
        run.say(budget_line(run.clock.before, max_minutes, "the reference pass stops before its next batch"))
    saves = _PartialSaves(run, path, keep and bool(run.cfg.save_every))
    with run.progress(len(batches), initial=len(out), label=f"{run.name} reference log-probs", unit="batch") as progress:
        try:
            for batch in batches[len(out):]:
                why = "SIGTERM" if stop_requested() else None
                if why is None and run.out_of_time(max_minutes):
                    why = f"the wall-time cap of {max_minutes:g} minutes"
                if why is not None:
                    raise StoppedBeforeTraining(_stopped(run, path, out, len(batches), why, keep),
                                                143 if why == "SIGTERM" else 1)
                out.append(score(model, batch))
                progress.update(len(out))
                saves.after_batch(out, len(batches))
                fault_point("reference_batch", len(out))
        except KeyboardInterrupt:
            if keep and run.dist.is_main:
                _save(run, path, out, len(batches))
                print(f"[{run.name}] interrupted in the reference log-prob pass: {len(out)} of {len(batches)} "
                      f"batches kept in {path}", flush=True)
            raise
    if keep and run.cfg.save_every and len(out) and run.dist.is_main:
        _save(run, path, out, len(batches))  # a resume from a checkpoint reads it instead of a second pass
    return out


def _stopped(run, path: Path, out: list, total: int, why: str, keep: bool) -> str:
    if keep and run.dist.is_main:
        _save(run, path, out, total)
    run.close()  # the run directory's lock, the trackers: as a stop at a checkpoint releases them
    kept = f"; their log-probs are kept in {path}" if keep and out else ""
    return (f"{why} stopped the reference log-prob pass at batch {len(out)} of {total}, before any training step "
            f"(no model written){kept}")


class _PartialSaves:
    """The pass so far, saved as it goes (a run that checkpoints): a SIGKILL (the OOM killer, a lost
    node), which no handler sees, then costs the batches since the last save, not the whole pass. A
    save rewrites the file, so the next waits ten times as long as it took: at most a tenth of the time."""

    def __init__(self, run, path: Path, enabled: bool):
        self.run, self.path, self.enabled = run, path, enabled
        self.last, self.cost = time.monotonic(), 0.0

    def after_batch(self, out: list, total: int) -> None:
        if self.enabled and len(out) < total and time.monotonic() - self.last >= 10 * self.cost:
            start = time.monotonic()
            _save(self.run, self.path, out, total)
            self.last = time.monotonic()
            self.cost = self.last - start


def _save(run, path: Path, out: list, total: int) -> None:
    cpu = [tuple(t.cpu() for t in x) if isinstance(x, tuple) else x.cpu() for x in out]
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"batches": total, "done": cpu, STATE_KEY: run.clock.seconds(), "scored_on": scored_on(run.cfg)}, tmp)
    tmp.replace(path)  # a kill while writing keeps the previous file whole


def _saved(run, path: Path, total: int) -> list:
    """The saved pass's batches, on the run's device; [] when there is none, it is of other batches,
    or it was scored on other inputs. The time it had taken counts for `--max_minutes` (a
    checkpoint's time replaces it, when one loads)."""
    try:
        saved = torch.load(path, weights_only=True)
        done = saved["done"] if isinstance(saved, dict) else None
        if not isinstance(done, list) or len(done) > total or not all(map(_scores, done)):
            raise ValueError("not a reference pass")
    except FileNotFoundError:
        return []
    except Exception as err:  # noqa: BLE001 - a damaged file costs a recomputation, not the run
        run.say(f"{path} cannot be read ({type(err).__name__}); computing the reference log-probs again")
        return []
    if not isinstance(saved.get("batches"), int) or saved["batches"] > total:
        return []  # fewer: a run of more --epochs, whose batches begin with these (`ordered_batches`)
    if (differ := _differences(saved.get("scored_on"), scored_on(run.cfg))) is not None:
        run.say(f"the reference log-probs in {path} were scored on other inputs ({differ} changed); "
                f"computing them again")
        return []
    run.clock.go_on_from(saved.get(STATE_KEY))
    return [tuple(run.to_device(*x)) if isinstance(x, (tuple, list)) else run.to_device(x) for x in done]


def scored_on(cfg) -> dict:
    """What the reference log-probs depend on: the data and model files' fingerprints (their bytes,
    not their names: a resume from elsewhere names them otherwise) and the options that may not
    change on resume. A file copied in from another run, or data or a model rewritten since (which
    a run without a checkpoint yet has nothing else to compare with), is not read."""
    from lmpo.trainers.checkpoint import RESUME_MAY_CHANGE

    files = {option: {k: v for k, v in print_.items() if k != "path"} for option, print_ in input_fingerprints(cfg).items()}
    # device and precision: `auto` and what it picks are one choice, as `--resume` compares them
    # epochs: more of them add batches after these (`ordered_batches`), counted by the file's `batches`
    named = set(DATA_OPTIONS) | set(MODEL_OPTIONS) | RESUME_MAY_CHANGE | {"device", "precision", "epochs"}
    options = {k: v for k, v in json.loads(json.dumps(dataclasses.asdict(cfg), default=str)).items() if k not in named}
    return {"files": files, "options": options}


def _differences(saved: dict | None, now: dict) -> str | None:
    """None when the pass was scored on `now`'s inputs, else the options that differ."""
    if not isinstance(saved, dict):
        return "its inputs are not recorded: they may have"
    was_files, was_options = saved.get("files") or {}, saved.get("options") or {}
    differ = sorted(f"--{k}" for k in was_files.keys() | now["files"].keys() if was_files.get(k) != now["files"].get(k))
    differ += sorted(f"--{k}" for k in was_options.keys() | now["options"].keys()
                     if was_options.get(k) != now["options"].get(k))
    return ", ".join(differ) if differ else None


def _scores(x) -> bool:
    return isinstance(x, torch.Tensor) or (isinstance(x, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in x))
