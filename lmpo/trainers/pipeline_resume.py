"""`lmpo pipeline --resume DIR`: continue an interrupted pipeline with its own options.

The pipeline's options must be the interrupted one's (as for `lmpo train --resume`: only
`threads`, `save_every` and the other options that change how a step is computed, not what it
trains, may differ). Its stages are then taken in order:
- a stage that finished with the options this pipeline gives it (its `result.json`) is kept, as
  long as every stage before it was kept: its model is the next stage's input;
- the first stage that was not kept resumes from its newest complete checkpoint, as `lmpo train
  STAGE --resume` would (it starts afresh when it has none, or when the run there is an earlier
  pipeline's, with other options); a stage's length (`--sft.epochs`, `--rl_stage.steps`) may
  change on resume by that command's rule (lmpo/trainers/resume_changes.py), and a finished stage
  given a length it may grow to goes on from its newest checkpoint;
- every stage after it runs afresh.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace
from pathlib import Path

from lmpo.trainers.checkpoint import check_same_config
from lmpo.trainers.resume_changes import extends_finished
from lmpo.trainers.result import StageResult
from lmpo.trainers.run_dir import (RUN_RECORD, RunDirError, check_resumable, complete_checkpoints, earlier_trainer,
                                  saved_config)

SUMMARY = "summary.json"  # what a pipeline writes when its last stage has ended


def resumed_pipeline(cfg, explicit: set[str]):
    """`cfg` with `out` set to the interrupted pipeline's own; RunDirError or ValueError for a
    directory that holds no pipeline to continue."""
    path = Path(cfg.resume)
    if not path.is_dir():
        raise RunDirError(f"--resume {path}: " + ("not a directory" if path.exists() else "no such directory"))
    if "out" in explicit and Path(cfg.out).resolve() != path.resolve():
        raise ValueError(f"--resume {path} continues the pipeline in that directory, and --out {cfg.out} names "
                         f"another: a resumed pipeline writes where it started; give --resume alone")
    check_resumable(path, "pipeline", None)  # a stage's own directory is resumed by its `lmpo train` command
    saved = saved_config(path)
    if not saved:
        raise RunDirError(f"--resume {path}: holds no pipeline ({path / RUN_RECORD} is missing or unreadable)")
    if (path / SUMMARY).is_file():
        raise RunDirError(f"--resume {path}: that pipeline finished ({path / SUMMARY}), so there is nothing to "
                          f"resume; its stages' models are in {path}/STAGE/model")
    own = saved.get("out")  # its stages' options name their directories as it did
    return replace(cfg, out=own if isinstance(own, str) and Path(own).resolve() == path.resolve() else str(path))


def check_fresh_start(cfg) -> None:
    """`lmpo train`'s rule for a pipeline started without --resume: an interrupted pipeline in
    `out` (its finished stages and its stage's checkpoints, work --resume continues) is refused
    unless --overwrite; a finished one is replaced, as a finished run is."""
    if cfg.resume:
        if cfg.overwrite:
            raise ValueError("--overwrite true starts a pipeline afresh and --resume continues one: give one of them")
        return
    out = Path(cfg.out)
    if cfg.overwrite or (out / SUMMARY).is_file() or earlier_trainer(out) != "pipeline":
        return
    stages = [p.parent for p in sorted(out.glob("*/run.json"), key=lambda p: p.stat().st_mtime)]
    held = [f"{s.name} finished" if (s / "result.json").is_file() else f"{s.name}'s checkpoint {done[-1].name}"
            for s in stages if (s / "result.json").is_file() or (done := complete_checkpoints(s))]
    if held:
        raise RunDirError(f"--out {out}: holds an interrupted pipeline ({', '.join(held)}); continue it with "
                          f"`lmpo pipeline --resume {out}`, start afresh there with --overwrite true (deletes its "
                          f"stages), or choose another --out")


def finished_stage(stage_cfg) -> StageResult | None:
    """The result of the stage in `stage_cfg.out` when it finished with these options, else None."""
    path = Path(stage_cfg.out)
    try:
        record = json.loads((path / "result.json").read_text())
    except (OSError, ValueError):
        return None
    # a changed cap or step count is not a finished stage kept (a resume may change them to go on with it)
    if not isinstance(record, dict) or not (path / "model").is_dir() or not _same_options(record.get("config"),
                                                                                           stage_cfg, GO_ON):
        return None
    fields = {f.name for f in dataclasses.fields(StageResult)}
    try:
        return StageResult(**{k: v for k, v in record.items() if k in fields})
    except TypeError:
        return None


def continued_stage(stage_cfg):
    """`stage_cfg` set to resume the run interrupted in its directory, when that run has a complete
    checkpoint and was started with these options, or to go on with the run that finished there
    when it is given a length it may grow to (as `lmpo train STAGE --resume` does: `extends_finished`);
    else `stage_cfg` as it is (a fresh start)."""
    path = Path(stage_cfg.out)
    saved = saved_config(path)
    if not complete_checkpoints(path) or not _same_options(saved, stage_cfg):
        return stage_cfg
    current = json.loads(json.dumps(dataclasses.asdict(stage_cfg), default=str))
    if (path / "result.json").is_file() and not extends_finished(path, saved, current):
        return stage_cfg
    return replace(stage_cfg, resume=str(path), overwrite=False)


# what `--resume` may change to train a run further (resume_changes): not a finished stage kept
GO_ON = ("max_minutes", "steps", "epochs", "rounds")


def _same_options(saved, stage_cfg, exactly: tuple[str, ...] = ()) -> bool:
    """Whether a stage's recorded options are `stage_cfg`'s, up to what a resume may change
    (except the options named in `exactly`)."""
    if not isinstance(saved, dict) or not saved:
        return False
    if any(saved.get(k) != getattr(stage_cfg, k, None) for k in exactly if k in saved):
        return False
    current = json.loads(json.dumps(dataclasses.asdict(stage_cfg), default=str))
    defaults = json.loads(json.dumps(dataclasses.asdict(type(stage_cfg)()), default=str))
    try:
        check_same_config({**{k: v for k, v in defaults.items() if k not in saved}, **saved}, current, "")
    except ValueError:
        return False
    return True
