"""Which `trajectories.jsonl` a run directory, a pipeline directory or a path names; saved steps in words."""

from __future__ import annotations

from pathlib import Path

from .run_records import unfinished_pipeline_stages

TRAJECTORIES_FILE = "trajectories.jsonl"


def find_trajectories(run_dir: str | Path, stage: str | None = None) -> Path:
    """The ``trajectories.jsonl`` to show for ``run_dir``.

    A run directory's own file; for a pipeline directory (``summary.json``, or an unfinished
    pipeline's ``run.json``), that of the stage named ``stage``, or else of the last stage that
    has one; a trajectories file given itself (``lmpo eval --out`` writes one too).
    """
    run_dir = Path(run_dir)
    if run_dir.is_file() and stage is None:
        if run_dir.name == "metrics.jsonl":  # read as trajectories, its first row was "missing key 'phase'"
            raise ValueError(f"{run_dir} is a run's metrics, not trajectories: `lmpo report` and `lmpo doctor` "
                             f"read it; give the run directory ({run_dir.parent}) or its {TRAJECTORIES_FILE}")
        return run_dir
    if not run_dir.exists():
        raise FileNotFoundError(f"{run_dir} does not exist")
    own, summary = run_dir / TRAJECTORIES_FILE, run_dir / "summary.json"
    if stage is None and own.is_file():
        return own
    unfinished = unfinished_pipeline_stages(run_dir)
    if not summary.is_file() and not unfinished:
        if stage is not None:
            raise FileNotFoundError(f"--stage {stage}: {run_dir} is not a pipeline directory "
                                    f"(no {summary}, and its run.json names no pipeline)")
        raise FileNotFoundError(f"no trajectories file: {own}")
    if unfinished:
        dirs: list[tuple[str, Path | None]] = [(d.name, d) for d in unfinished]
        summary = f"the stage directories of {run_dir}, a pipeline without summary.json yet"
    else:
        from .stages import read_summary

        dirs = [(s.name, _stage_dir(run_dir, s.run_dir)) for s in read_summary(summary)[0]]
    if stage is not None:
        matches = [d for name, d in dirs if name == stage]
        if not matches:
            names = ", ".join(name for name, _ in dirs) or "none"
            raise ValueError(f"--stage {stage}: no such stage in {summary} (stages: {names})")
        if matches[-1] is None:
            raise FileNotFoundError(f"--stage {stage}: the stage has no run directory in {summary}")
        return matches[-1] / TRAJECTORIES_FILE
    for _, stage_dir in reversed(dirs):
        if stage_dir is not None and (stage_dir / TRAJECTORIES_FILE).is_file():
            return stage_dir / TRAJECTORIES_FILE
    raise FileNotFoundError(f"no trajectories file: neither {own} nor one in any stage "
                            f"listed in {summary}")


def _stage_dir(run_dir: Path, sub: str | None) -> Path | None:
    if not sub:
        return None
    path = Path(sub)
    return path if path.is_absolute() else run_dir / path


def step_ranges(steps: list[int], shown: int = 12) -> str:
    """`1-6, 8, 10-12`; the first and last few runs of a longer list."""
    runs: list[list[int]] = []
    for step in steps:
        if runs and step == runs[-1][-1] + 1:
            runs[-1].append(step)
        else:
            runs.append([step])
    texts = [f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs]
    return ", ".join(texts if len(texts) <= shown else [*texts[:shown // 2], "...", *texts[-shown // 2:]])
