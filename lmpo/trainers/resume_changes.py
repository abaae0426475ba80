"""What `--resume RUN` may change of the run it continues, beyond `RESUME_MAY_CHANGE`
(lmpo/trainers/checkpoint.py), and the finished runs it may go on with.

- `--max_minutes`: it says only where a run stops; except from or to 0 where it alone turns a
  stopping rule on or off (`cap_switch_problem`).
- A run stopped by its wall-time cap finishes (model/, result.json) and, when it checkpoints,
  writes a checkpoint at the step it stopped at, noted in result.json (`cap_record`); `--resume
  RUN --max_minutes M` goes on from it as if the run had never stopped (`continued_cap`).
- The option that says how long a run is (`length_option`: `--steps`, `--epochs`, online DPO's
  and RFT's `--rounds`) may grow where nothing computed so far depends on it: with a constant learning-rate
  schedule (`extension_problem`). A finished run is extended from its newest checkpoint
  (`extends_finished`): its last checkpoint comes before its last step, so the steps since are
  trained again, to the same result, and its model, metrics and result.json are rewritten.
  A run stopped before its first checkpoint trained nothing it keeps: it starts again, with any
  length (`untrained_length`), which its run.json then records (`record_lengths`). A pipeline's
  stage's length changes by the same rule, applied to that stage's directory.
"""

from __future__ import annotations

import json
from pathlib import Path

from lmpo.trainers.run_clock import STATE_KEY


def cap_switch_problem(saved: dict, current: dict) -> str | None:
    """`max_minutes` may change on resume, except from or to 0 where, without `stop_patience`, it
    alone turns a stopping rule on or off (CPT, RL): held-out evaluations to pick the best model
    on, and that model kept instead of the last, would change what the run computes."""
    for key in sorted(k for k in saved.keys() | current.keys() if k.rpartition(".")[2] == "max_minutes"):
        section = key.rpartition(".")[0]
        patience = f"{section}.stop_patience" if section else "stop_patience"
        if patience not in saved or saved.get(patience) or current.get(patience):
            continue  # no stopping rule (the offline trainers' plain cap), or patience keeps one on
        before, now = saved.get(key, 0), current.get(key, 0)
        if bool(before) != bool(now):
            return (f"{key}={now!r} (was {before!r}): here the wall-time cap is a stopping rule (held-out "
                    f"evaluations, the best model kept), which {'0 turns off' if before else 'this turns on'}; "
                    f"give {'a larger --max_minutes (it counts the time trained before) instead of 0' if before else '--max_minutes 0, as the run had'}")
    return None


def length_option(options: dict) -> str | None:
    """The option that says how long a run is: CPT's and RL's `steps`; online DPO's and RFT's
    `rounds` (online DPO's `epochs` are passes over each round's pairs, RFT's `sft_steps_per_round`
    its steps: what a round computes); the `epochs` of SFT, the reward model and the offline
    preference trainers. None for a pipeline (its stages' options are sections: `_stage_lengths`).
    The data order of an epoch, round or step never depends on the total (seeded passes drawn one
    after another: `EpochOrder`, `ordered_batches`, `CPTBatches`, `PromptStream`), nor do the
    checkpoint and evaluation cadences before the last step; only the schedule's decay does."""
    if "steps" in options:
        return "steps"
    if "rounds" in options:
        return "rounds" if "epochs" in options or "sft_steps_per_round" in options else None
    return "epochs" if "epochs" in options else None


# what each length option's decay runs over, and what it counts, for the refusal
_DECAYS_OVER = {"steps": ("the run's --steps", "steps", ""),
                "epochs": ("the run's steps (--epochs passes over the data)", "steps", " epochs"),
                "rounds": ("the run's --rounds", "rounds", "")}


def extension_problem(saved: dict, current: dict) -> str | None:
    """Why the run's length (`length_option`) may not grow on resume (None: it may; "": it did not
    grow). What a step computes depends on the total only through the learning-rate schedule's
    warm-up-then-decay: with a constant schedule the steps trained so far are those of a run
    planned longer."""
    key = length_option(saved)
    before, now = saved.get(key), current.get(key)
    if key is None or not isinstance(before, int) or not isinstance(now, int) or now <= before:
        return ""
    if current.get("lr_schedule") == "constant":
        return None
    schedule = f"{current['lr_schedule']} " if current.get("lr_schedule") else ""
    over, done, unit = _DECAYS_OVER[key]
    return (f"{key}={now} (was {before}): the {schedule}learning-rate schedule decays over {over}, so the {done} "
            f"already trained would have had other rates in a run of {now}{unit}; only a run with --lr_schedule "
            f"constant can be extended")


# A run stopped by its wall-time cap before its last step finishes (model/, result.json) and, when
# it checkpoints, writes a checkpoint at the step it stopped at, named in result.json under this
# key; `--resume RUN --max_minutes M` then continues it as if it had never stopped.
CAP_RECORD = "time_cap"


# In the state of the checkpoint written where a run stopped at its cap: a kill before its model and
# result.json, then `--resume` with a cap that has run out too, ends there, as the run would have
# (not after one step more, where a checkpoint of a run still in time would go on to).
CAP_STOP = "stopped_at_cap"


def stops_at_once(run, resumed, max_minutes: float) -> bool:
    """Whether a resumed run ends at its checkpoint without a step: it was written at a stop at the
    cap, and `max_minutes` has run out too."""
    return bool(resumed is not None and resumed.state.get(CAP_STOP) and max_minutes and run.out_of_time(max_minutes))


def cap_record(step: int, steps: int, max_minutes: float, checkpointed: bool) -> dict:
    """result.json's note of a stop at the cap: after `step` of `steps`, and whether it can go on."""
    return {CAP_RECORD: {"step": step, "steps": steps, "max_minutes": max_minutes, "checkpoint": checkpointed}}


def continued_cap(run_dir, max_minutes: float) -> dict | None:
    """For `--resume` of a finished run: its cap record when it stopped at its wall-time cap with a
    checkpoint of that step, the newest (it then goes on from there); None when it did not stop so.
    Raises RunDirError when it did but cannot go on, or `max_minutes` leaves it no time."""
    from lmpo.trainers.run_dir import RunDirError, complete_checkpoints

    try:
        cap = json.loads((Path(run_dir) / "result.json").read_text()).get(CAP_RECORD)
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(cap, dict):
        return None
    done = complete_checkpoints(run_dir)
    if not cap.get("checkpoint") or not done or done[-1].name != f"step_{cap['step']:06d}":
        why = ("its checkpoint of that step is no longer in " + str(Path(run_dir) / "checkpoints") if cap.get("checkpoint")
               else "without a checkpoint of that step (--save_every 0)")
        raise RunDirError(f"--resume {run_dir}: that run stopped at its wall-time cap after step {cap['step']} of "
                         f"{cap['steps']}, {why}, so it cannot go on; "
                         f"train its model further with a new run (--model {Path(run_dir) / 'model'})")
    spent = _seconds_at(done[-1])
    if max_minutes and spent is not None and 60 * max_minutes <= spent:
        raise RunDirError(f"--resume {run_dir}: that run stopped at its wall-time cap of {cap['max_minutes']:g} minutes "
                         f"after step {cap['step']} of {cap['steps']}, {spent / 60:.2f} minutes of training; "
                         f"--max_minutes counts those too, so give more than {spent / 60:.2f} (or 0: no cap)")
    return cap


def _seconds_at(checkpoint) -> float | None:
    try:
        return json.loads((checkpoint / "state.json").read_text()).get(STATE_KEY)
    except (OSError, ValueError, AttributeError):
        return None


def check_finished_goes_on(run_dir: Path, saved: dict, current: dict) -> None:
    """`--resume` of a finished run: refused (RunDirError) unless it stopped at its cap or is given
    a longer length (`length_option`) that may grow; its kept checkpoints would otherwise redo its last
    steps and rewrite model/."""
    from lmpo.trainers.run_dir import RunDirError

    if not (run_dir / "result.json").is_file() or continued_cap(run_dir, current.get("max_minutes", 0)) is not None:
        return
    if extends_finished(run_dir, saved, current):
        if (stop := _stopped_by_rule(run_dir)) is not None:
            raise RunDirError(f"--resume {run_dir}: that run was ended at step {stop.get('step')} by its stopping rule "
                              f"({stop['stopped']}), which would end it there again however many --steps; to train "
                              f"its model further, start a new run from it (--model {run_dir / 'model'})")
        return
    why = ", so there is nothing to resume"
    if extension_problem(_finished_plan(run_dir, saved), current) is None:  # longer, but no checkpoint
        key = length_option(saved)
        why = (f" and kept no checkpoint in {run_dir / 'checkpoints'} to go on to --{key} {current.get(key)} from "
               f"(--save_every 0, or deleted)")
    raise RunDirError(f"--resume {run_dir}: that run finished (result.json){why}; its "
                      f"model is {run_dir / 'model'}: to train it further, start a new run from it "
                      f"(--model {run_dir / 'model'})")


def extends_finished(run_dir, saved: dict, current: dict) -> bool:
    """A finished run (not stopped at its cap) resumed with a longer length that may grow (more
    `--steps`, `--epochs`, `--rounds`), and a checkpoint to go on from (else its model starts a new run)."""
    from lmpo.trainers.run_dir import complete_checkpoints

    return extension_problem(_finished_plan(run_dir, saved), current) is None and bool(complete_checkpoints(run_dir))


def _finished_plan(run_dir, saved: dict) -> dict:
    """`saved` (run.json's options: the run as started) with the length it finished with (its
    `length_option`), from result.json: an extended run's is more than it started with, and no
    longer run is resumed."""
    key = length_option(saved)
    try:
        length = json.loads((Path(run_dir) / "result.json").read_text())["config"][key]
    except (OSError, ValueError, KeyError, TypeError):
        return saved
    return {**saved, key: length} if isinstance(length, int) else saved


def _stopped_by_rule(run_dir: Path) -> dict | None:
    """The metrics row of a stop by `stop_patience` (not by time: a larger cap goes further), if any."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("stopped"), str):
            return None if row["stopped"].startswith("the wall-time cap") else row
    return None


def going_on_with(run_dir: Path, name: str, current: dict) -> None:
    """After the checks of `--resume`, what the run directory says of the run that goes on."""
    record_lengths(run_dir, current)
    reopen_finished(run_dir, name)


def reopen_finished(run_dir: Path, name: str) -> None:
    """A finished run that `--resume` goes on with (checked before) is no longer finished: a kill now
    leaves an interrupted run, not one whose result.json speaks of fewer steps."""
    if (run_dir / "result.json").is_file():
        print(going_on(run_dir, name), flush=True)
        (run_dir / "result.json").unlink()


def going_on(run_dir, name: str) -> str:
    """What `--resume` of a finished run tells the user, before it takes result.json away."""
    newest = _newest(run_dir)
    try:
        result = json.loads((Path(run_dir) / "result.json").read_text())
    except (OSError, ValueError):
        result = {}
    cap = result.get(CAP_RECORD) if isinstance(result, dict) else None
    if isinstance(cap, dict):
        return (f"[{name}] {run_dir} stopped at its wall-time cap after step {cap.get('step')} of "
                f"{cap.get('steps')}; going on from {newest}")
    config = result.get("config") if isinstance(result, dict) else None
    key = length_option(config) if isinstance(config, dict) else None
    unit = "rounds" if key == "rounds" else "steps"
    return (f"[{name}] {run_dir} finished; going on to the longer --{key or 'steps'} from its newest checkpoint, "
            f"{newest} (the {unit} after it are trained again, to the same result, and its model/ and result.json "
            f"rewritten)")


def _newest(run_dir) -> str:
    from lmpo.trainers.run_dir import complete_checkpoints

    done = complete_checkpoints(run_dir)
    return done[-1].name if done else "the start"


def _nothing_trained(run_dir) -> bool:
    """An interrupted run with no complete checkpoint (or a stage not begun): it starts from the beginning."""
    from lmpo.trainers.run_dir import complete_checkpoints

    return not (Path(run_dir) / "result.json").is_file() and not complete_checkpoints(run_dir)


def untrained_length(run_dir, saved: dict, current: dict) -> dict:
    """`saved` with the length (`length_option`) of `current` where it may change: the run kept
    nothing trained (it starts over, so no step computed under the old length is kept, whatever the
    schedule); for a pipeline, each stage's by the rule of `lmpo train STAGE --resume` (`_stage_lengths`)."""
    if any(isinstance(v, dict) for v in saved.values()):
        return _stage_lengths(Path(run_dir), saved, current)
    key = length_option(saved)
    if key is None or key not in current or not _nothing_trained(run_dir):
        return saved
    return {**saved, key: current[key]}


def _stage_lengths(run_dir: Path, saved: dict, current: dict) -> dict:
    """A pipeline's stage sections with their new lengths where the stage may take them: it has
    trained nothing yet, or its schedule lets it grow (`extension_problem`); ValueError naming the
    stage and option where it has trained and the schedule decays."""
    out = dict(saved)
    for section, options in saved.items():
        now = current.get(section)
        key = length_option(options) if isinstance(options, dict) and isinstance(now, dict) else None
        if key is None or options.get(key) == now.get(key):
            continue
        stage = run_dir / (str(saved.get("rl")) if section == "rl_stage" else section)
        why = None if _nothing_trained(stage) else extension_problem(options, now)
        if why:
            raise ValueError(f"--resume {run_dir}: {section}.{why.replace('--lr_schedule', f'--{section}.lr_schedule')}"
                             f", and its {stage.name} stage has trained ({stage}); resume with the pipeline's own "
                             f"--{section}.{key} {options.get(key)}, then train {stage / 'model'} further in a new run")
        if why is None:
            out[section] = {**options, key: now[key]}
    return out


def record_lengths(run_dir, current: dict) -> None:
    """After the checks of `--resume`: run.json takes the lengths of the run that goes on (the run's
    own, a pipeline's stages'), which those checks allowed, so that a later `--resume` (or the
    options it reuses) is of the run now being trained."""
    from lmpo.trainers.run_dir import RUN_RECORD, write_text

    record = Path(run_dir) / RUN_RECORD
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return
    config = data.get("config") if isinstance(data, dict) else None
    if not isinstance(config, dict):
        return
    updated = _with_lengths(config, current)
    for section, options in config.items():
        if isinstance(options, dict) and isinstance(current.get(section), dict):
            updated[section] = _with_lengths(options, current[section])
    if updated != config:
        data["config"] = updated
        tmp = record.with_name(record.name + ".tmp")  # a kill while writing keeps the old record whole
        write_text(tmp, json.dumps(data, indent=2, default=str))
        tmp.replace(record)


def _with_lengths(options: dict, current: dict) -> dict:
    key = length_option(options)
    return {**options, key: current[key]} if key is not None and key in current else dict(options)
