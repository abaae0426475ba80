"""The doctor on run directories: which stages a directory holds, each stage's metrics, trainer,
options and result, handed to `lmpo.reports.doctor.diagnose`."""

from __future__ import annotations

import json
from pathlib import Path

from .doctor import Finding, diagnose
from .doctor_faults import check_abandoned_nonfinite
from .metrics import kept_rows, read_metrics, refuse_non_file
from .run_records import unfinished_pipeline_stages


# The trainers (run.json's `trainer`) whose metrics rows come every --log_every steps (named here so
# that the doctor runs without torch; a test keeps them equal); RL, online DPO and RFT log every step or round.
LOG_EVERY_TRAINERS = ("cpt", "sft", "dpo", "rm", "kto", "orpo")


def diagnose_run(path: str | Path) -> dict[str, list[Finding]]:
    """Findings per stage of a pipeline directory, per run of a directory that holds runs further
    in (`lmpo compare`'s SEED/METHOD/STAGE, `lmpo factcheck`'s runs/NAME, or a mix of those and
    runs of its own), or of one stage directory. Of several runs, one that cannot be read is a
    finding of severity "error" (`lmpo doctor` exits 2 after printing the others' findings)."""
    path = _run_dir(Path(path))
    runs = labelled_runs(path)
    if list(runs.values()) == [path]:  # the run itself: what stops its reading is the command's error
        return {path.name: diagnose_stage(path)}
    return {label: _diagnose_one_of_several(d) for label, d in runs.items()}


def _diagnose_one_of_several(stage_dir: Path) -> list[Finding]:
    """A run of a pipeline or a directory of runs; one that cannot be diagnosed, for whatever
    reason, is an "error" finding of its own, so that it does not hide the others' findings."""
    try:
        return diagnose_stage(stage_dir)
    except Exception as err:  # noqa: BLE001 - said in the output, and `lmpo doctor` exits 2
        return [Finding("unreadable", "error", "run directory", type(err).__name__, "readable",
                        f"could not be diagnosed: {err}",
                        f"repair or move aside what the error names, or move {stage_dir} out of the directory")]


def unfinished_notes(path: str | Path) -> dict[str, str]:
    """`lmpo report`'s note on each run `diagnose_run` reads that has not finished (no
    result.json), by the same labels: its findings cover only the steps it logged so far."""
    from .report import unfinished_note

    notes = {label: unfinished_note(d) for label, d in labelled_runs(_run_dir(Path(path))).items()}
    return {label: note for label, note in notes.items() if note}


def labelled_runs(path: Path) -> dict[str, Path]:
    """The run directories `diagnose_run` reads, by the label it gives each."""
    if (path / "summary.json").is_file() or not (path / "metrics.jsonl").is_file():
        runs = run_dirs(path)
        if not runs:
            refuse_non_file(path / "metrics.jsonl")
            raise ValueError(f"{path}: no metrics.jsonl here nor in the run directories under it")
        return {d.relative_to(path).as_posix(): d for d in runs}
    return {path.name: path}


def _run_dir(path: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if path.is_file():
        if path.name != "metrics.jsonl":
            raise ValueError(f"{path} is a file, not a run directory (the directory holding it is {path.parent})")
        return path.parent
    return path


def run_dirs(path: Path) -> list[Path]:
    """Every directory with a metrics.jsonl up to four levels under `path` (a comparison's
    SEED/METHOD/STAGE in a folder of its own; a run next to a pipeline or a comparison is one of
    several, not the only one), the stages of each pipeline in its summary.json's order."""
    found = {m.parent for depth in range(1, 5) for m in path.glob("*/" * depth + "metrics.jsonl")}
    by_parent: dict[Path, list[Path]] = {}
    for run in sorted(found):
        by_parent.setdefault(run.parent, []).append(run)
    return [run for parent in sorted(by_parent) for run in _ordered(parent, by_parent[parent])]


def diagnose_stage(stage_dir: Path) -> list[Finding]:
    kind, config = _run_info(stage_dir)
    group = config.get("group_size") if isinstance(config.get("group_size"), int) else None
    logged = read_metrics(stage_dir / "metrics.jsonl")
    rows = kept_rows(logged)  # the kept branch, as the report plots it
    if not rows:  # "no problems found" would pass an empty log off as a healthy run
        log = ("log a row sooner (--log_every N: every N steps)" if kind in LOG_EVERY_TRAINERS else
               "let the run finish its first step or round (it logs a row after each)")
        return [Finding("no_rows", "note", "metrics.jsonl", "0 rows", ">= 1 row",
                        f"{stage_dir / 'metrics.jsonl'} holds no rows, so there is nothing to diagnose",
                        f"{log}, or point the doctor at the run that did")]
    advantage = config.get("advantage") if isinstance(config.get("advantage"), str) else None
    rewards = config.get("rewards") if isinstance(config.get("rewards"), str) else None
    # the problems (a reward model: the pairs) behind each held-out share
    counts = config.get("heldout_pairs" if kind == "rm" else "eval_problems")
    eval_n = counts if isinstance(counts, int) else None
    return diagnose(rows, kind, group_size=group, final=_result(stage_dir), advantage=advantage, rewards=rewards,
                    eval_n=eval_n) + check_abandoned_nonfinite(logged)


def _ordered(path: Path, stages: list[Path]) -> list[Path]:
    """Stages in the pipeline's order when summary.json says it, or, before the pipeline wrote
    it, in the order they started."""
    try:
        names = [s["run_dir"] for s in json.loads((path / "summary.json").read_text())["stages"]]
    except (OSError, ValueError, KeyError, TypeError):
        names = [stage.name for stage in unfinished_pipeline_stages(path)]
    rank = {n: i for i, n in enumerate(names)}
    return sorted(stages, key=lambda d: rank.get(d.name, len(rank)))


def _run_info(stage_dir: Path) -> tuple[str, dict]:
    """(trainer name, options) from the stage's run.json; the directory's name when absent."""
    try:
        info = json.loads((stage_dir / "run.json").read_text())
        return str(info.get("trainer") or stage_dir.name), dict(info.get("config") or {})
    except (OSError, ValueError, AttributeError, TypeError):
        return stage_dir.name, {}


def _result(stage_dir: Path) -> dict | None:
    """The stage's result.json (written when it ended), or None."""
    try:
        result = json.loads((stage_dir / "result.json").read_text())
    except (OSError, ValueError):
        return None
    return result if isinstance(result, dict) else None
