"""A run directory, opened safely by every trainer before any model loads.

`open_run_dir(out, cfg, name)`:
- checks the path: `--out` that is a file, a directory that cannot be created or written
  (read-only, permissions), and `--resume` of a directory that does not exist are one-line
  `RunDirError`s naming the path and the cause; so is `--out` that holds a saved model (its
  `config.json` would be overwritten by the run's), before anything is written there, and so is
  a pipeline's `--out` that holds a single stage's run, or a stage's that holds a pipeline;
- takes an exclusive lock (`RUN_DIR/.lock`, `fcntl.flock`) for the whole run: a second run on the
  same directory is refused, naming the process that holds it. The kernel releases the lock when
  its process dies, however it dies, so a lock left by a killed run never blocks `--resume`;
- on `--resume`, compares the run's options with the saved ones (`config.json`, written by
  the RL loop) and the command that started it (`run.json`), and refuses with the list of
  differences but those `resume_changes` allows (`--max_minutes`, a longer run).
- on a fresh start, clears what an earlier run left there: a finished run's checkpoints,
  `result.json` and the files it wrote (metrics, trajectories, report, kept best model, RFT's
  `round_K/`; see `EARLIER_RUN_FILES`) are removed (said in one line), so that a later `--resume` can only
  continue this run and no report or doctor reads the earlier run as this one; an interrupted
  run's checkpoints are work that `--resume` would continue, so a fresh start over them is
  refused unless `overwrite` is set.

File-system faults met later (a full disk while writing a checkpoint or the metrics) are
turned into one line by `fs_faults.fs_error`, naming the path and the cause.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import sys
import time
from pathlib import Path

from lmpo.keyed import keyed
from lmpo.trainers.fs_faults import fault_cause, fs_error
from lmpo.trainers.resume_changes import check_finished_goes_on, going_on_with, untrained_length

LOCK_NAME = ".lock"
RUN_RECORD = "run.json"
MARKER = "COMPLETE"
"""The file written last into a checkpoint: a checkpoint without it is incomplete."""
_HELD: dict[str, int] = {}  # run directories this process holds: real path -> lock fd
_COMMAND: list[str] = []  # the `lmpo train NAME` being run, set by the CLI (see `command`)


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def complete_checkpoints(run_dir: str | Path) -> list[Path]:
    """Every complete checkpoint of a run, oldest first."""
    root = checkpoint_dir(run_dir)
    return sorted(p for p in root.glob("step_*") if (p / MARKER).exists()) if root.is_dir() else []


class RunDirError(OSError):
    """A run directory that cannot be used: one line naming the path and the cause."""

    def __str__(self) -> str:  # OSError's own str() would prefix an errno
        return self.args[0] if self.args else ""


@contextlib.contextmanager
def command(name: str):
    """While the CLI runs `lmpo train NAME`: recorded in a fresh run's `run.json`, and a
    resumed run must be continued by the same command (another preset is another method)."""
    _COMMAND.append(name)
    try:
        yield
    finally:
        _COMMAND.pop()


@dataclasses.dataclass
class RunDir:
    path: Path
    lock_fd: int | None

    def close(self) -> None:
        """Release the lock (the kernel releases it anyway when the process ends)."""
        if self.lock_fd is not None:
            key = next((k for k, fd in _HELD.items() if fd == self.lock_fd), None)
            if key is not None:
                del _HELD[key]
            with contextlib.suppress(OSError):
                os.close(self.lock_fd)
            self.lock_fd = None


def remove_if_only_records(out: str | Path) -> None:
    """A run refused or failed before it wrote anything of its own (a check made after its
    directory was opened: a LoRA target, a tracker not installed) leaves no directory behind, as
    one refused earlier does. For a directory this invocation created: the caller says so."""
    out = Path(out)
    records = {".lock", "config.json", RUN_RECORD}
    empty_logs = {"metrics.jsonl", "trajectories.jsonl"}  # opened, nothing written yet
    if out.is_dir() and all(p.name in records or (p.name in empty_logs and p.stat().st_size == 0)
                            for p in out.iterdir()):
        shutil.rmtree(out, ignore_errors=True)


def open_run_dir(out: str | Path, cfg, name: str) -> RunDir:
    """Validate, create and lock a run directory; on resume, refuse changed options."""
    resume = bool(getattr(cfg, "resume", ""))
    flag = "--resume" if resume else "--out"
    path = Path(out)
    if resume and not path.is_dir():
        raise RunDirError(f"--resume {path}: " + ("not a directory" if path.exists() else "no such directory"))
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{flag} {path}: exists and is not a directory")
    if not resume and (model_files := _saved_model_files(path)):
        raise RunDirError(f"--out {path}: holds a model ({', '.join(model_files)}), not a run; a run writes its "
                          f"own config.json, metrics and model/ there, which would break that model, so choose "
                          f"another --out")
    if not resume and (earlier := earlier_trainer(path)) and (earlier == "pipeline") != (name == "pipeline"):
        what = "a pipeline, whose stages are in its sub-directories" if earlier == "pipeline" else \
            f"a finished or interrupted {earlier} run"
        raise RunDirError(f"--out {path}: holds {what}; this {name}{'' if name == 'pipeline' else ' run'} "
                          f"there would mix its files with that one's and delete some of them, so choose "
                          f"another --out (or delete {path} first)")
    if not resume and getattr(cfg, "lora_r", 0) and Path(str(cfg.model)).resolve() == (path / "model").resolve():
        raise RunDirError(f"--out {path}: its model/ is this run's --model, the base its LoRA adapter is trained on, "
                          f"and the adapter would take its place there at the end; choose another --out")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunDirError(f"{flag} {path}: cannot create the run directory: {fault_cause(err)}") from None
    run = RunDir(path, _lock(path, flag))
    try:
        _probe_writable(path, flag)
        tidy_interrupted_swaps(path)
        record = path / RUN_RECORD
        if resume:
            _check_resumed(path, cfg, name)
            going_on_with(path, name, dataclasses.asdict(cfg))
        else:
            _clear_earlier_run(path, name, bool(getattr(cfg, "overwrite", False)))
            write_text(record, json.dumps({"trainer": name, "command": _COMMAND[-1] if _COMMAND else None,
                                           "cwd": os.getcwd(),  # where its relative paths start (a resume from elsewhere)
                                           "config": dataclasses.asdict(cfg)}, indent=2, default=str))
    except BaseException:
        run.close()
        raise
    return run


def earlier_trainer(path: Path) -> str | None:
    """What ran in `path` before, as its `run.json` says (None: nothing, or unreadable)."""
    try:
        trainer = json.loads((path / RUN_RECORD).read_text()).get("trainer")
    except (OSError, ValueError, AttributeError):
        return None
    return trainer if isinstance(trainer, str) else None


def _saved_model_files(path: Path) -> list[str]:
    """The files that make `path` a saved model (Hugging Face or PEFT), not a run directory (a
    run's own config.json holds its options, and its model sits in model/)."""
    if not path.is_dir() or (path / RUN_RECORD).exists():
        return []
    found = [f.name for pattern in ("*.safetensors", "pytorch_model*.bin", "adapter_config.json")
             for f in sorted(path.glob(pattern))]
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        config = None
    if isinstance(config, dict) and "model_type" in config:
        found.insert(0, f"config.json of a {config['model_type']} model")
    return found[:3]


def _clear_earlier_run(path: Path, name: str, overwrite: bool) -> None:
    """A fresh start in a directory an earlier run used: its checkpoints must not outlive it, or a
    later `--resume` of this run would load the earlier run's weights (newer step numbers win)."""
    root, result = checkpoint_dir(path), path / "result.json"
    done, finished = complete_checkpoints(path), result.is_file()
    if done and not finished and not overwrite:
        raise RunDirError(f"--out {path}: holds an interrupted run (its newest complete checkpoint: {done[-1].name}); "
                          f"continue it with --resume {path} and that run's options, start afresh there with "
                          f"--overwrite true (deletes its checkpoints), or choose another --out")
    ours = (path / RUN_RECORD).is_file()
    # what killed writes left (never read): atomic writes' NAME.tmp, checkpoints a killed start moved aside
    killed = sorted([*path.glob("*.tmp"), *path.glob(".old-checkpoints-*")]) if ours else []
    earlier = [path / f for f in EARLIER_RUN_FILES if (path / f).exists()] + _rft_rounds(path) + killed if ours else []
    if done or earlier:
        kind = "finished" if finished else "interrupted" if done else "earlier"
        what = f"its {len(done)} checkpoint(s) and its files deleted" if done else "its files deleted"
        what += f", with what a killed write left: {', '.join(p.name for p in killed)}" if killed else ""
        print(f"[{name}] {path}: replacing the {kind} run there ({what}; its model/ is replaced at the end)")
    aside = path / f".old-checkpoints-{os.getpid()}"
    shutil.rmtree(aside, ignore_errors=True)  # a killed start's, of a process that had this id
    try:  # renamed aside first: a crash while deleting leaves nothing that looks like a checkpoint
        if root.is_dir():
            root.rename(aside)
        # even without checkpoints: a stale result.json would later pass this run off as finished
        result.unlink(missing_ok=True)
        for old in earlier:  # read later as this run's (metrics, trajectories, a kept best model)
            shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink(missing_ok=True)
    except OSError as err:
        raise RunDirError(f"--out {path}: cannot remove the earlier run's files: {fault_cause(err)}") from None
    shutil.rmtree(aside, ignore_errors=True)


EARLIER_RUN_FILES = ("metrics.jsonl", "config.json", "trajectories.jsonl", "reward_workers.log", "reward_failures.jsonl",
                     "summary.json", "eval.json", "critic.safetensors", "report", "best", "tensorboard", "reference_logps.pt")
"""What a run writes in its directory beside checkpoints/, result.json and model/, removed when a new run
starts there (only where `run.json` says an earlier run wrote them), with RFT's `round_K/` (`_rft_rounds`)
and what killed writes left (`NAME.tmp`, `.old-checkpoints-PID`). model/ may be the new run's input
(`--model RUN/model`): it stays until the new run's model replaces it whole (`Run.finish`)."""


RFT_ROUND_FILES = frozenset({"samples.jsonl", "hard_prompts.jsonl"})  # lmpo.trainers.rft's SAMPLES, HARD_PROMPTS


def _rft_rounds(path: Path) -> list[Path]:
    """An RFT run's `round_K/` directories (K digits, holding nothing but its round files), removed
    with the run's other files: a later run of fewer rounds would otherwise sit beside them."""
    rounds = [d for d in path.glob("round_*") if d.name[len("round_"):].isdigit()
              and d.is_dir() and not d.is_symlink()]
    return sorted(d for d in rounds if {f.name for f in d.iterdir()} <= RFT_ROUND_FILES)


def staging_directory(target: Path) -> Path:
    """An empty directory beside `target` to write its replacement in (see `replace_directory`)."""
    fresh = target.with_name(f".{target.name}-new-{os.getpid()}")
    shutil.rmtree(fresh, ignore_errors=True)
    return fresh


def replace_directory(fresh: Path, target: Path) -> None:
    """`fresh` takes `target`'s place whole; what `target` held is deleted after the swap."""
    aside = target.with_name(f".{target.name}-old-{os.getpid()}")
    shutil.rmtree(aside, ignore_errors=True)
    try:
        if target.exists():
            target.rename(aside)
        fresh.rename(target)
    except OSError as err:
        raise RunDirError(fs_error(target, err)) from None
    shutil.rmtree(aside, ignore_errors=True)


def tidy_interrupted_swaps(path: Path, names: tuple[str, ...] = ("model", "best")) -> None:
    """What a run killed while replacing its `model/` or `best/` left (under the run's lock): a half-written
    `.name-new-PID` is deleted, and the old `name/` moved aside as `.name-old-PID` is deleted once `name/`
    is there again, or put back when the kill fell between the two renames of `replace_directory`."""
    for name in names:
        target = path / name
        for old in sorted(path.glob(f".{name}-old-*")):
            if not target.exists() and old.is_dir():
                old.rename(target)
            else:
                shutil.rmtree(old, ignore_errors=True)
        for fresh in path.glob(f".{name}-new-*"):
            shutil.rmtree(fresh, ignore_errors=True)


def lock_directory(path: str | Path, flag: str = "--out") -> None:
    """Hold `path` (created if missing) for this process, as a run directory is held: a second
    process that asks is refused, naming the holder. For commands that write one directory from
    several runs (`lmpo compare`)."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunDirError(f"{flag} {path}: cannot create the directory: {fault_cause(err)}") from None
    _lock(path, flag)


def _lock(path: Path, flag: str) -> int:
    key = os.path.realpath(path)
    if key in _HELD:  # this process ran here before (a library caller, a test): not a concurrent run
        with contextlib.suppress(OSError):
            os.close(_HELD.pop(key))
    lock = path / LOCK_NAME
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as err:
        raise RunDirError(f"{flag} {path}: cannot write there: {fault_cause(err)}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise keyed(RunDirError(f"{flag} {path}: the run directory is in use by {holder}; wait for it to end, "
                                f"or choose another --out"), "run_dir.in_use", flag=flag, path=path, holder=holder) from None
    except OSError as err:
        os.close(fd)
        raise RunDirError(f"{flag} {path}: cannot lock {lock}: {fault_cause(err)}") from None
    info = json.dumps({"pid": os.getpid(), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                       "argv": [os.path.basename(sys.argv[0]), *sys.argv[1:]]})
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (info + "\n").encode(), 0)
    except OSError as err:
        os.close(fd)
        raise RunDirError(fs_error(lock, err)) from None
    _HELD[key] = fd
    return fd


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        info = {}
    if "pid" not in info:
        return "another process"
    return f"process {info['pid']} (`{' '.join(info.get('argv', []))}`, started {info.get('started', '?')})"


def _probe_writable(path: Path, flag: str) -> None:
    probe = path / f".write-test-{os.getpid()}"
    try:
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as err:
        with contextlib.suppress(OSError):
            probe.unlink()
        raise RunDirError(f"{flag} {path}: cannot write there: {fault_cause(err)}") from None


def check_resumable(path: str | Path, name: str | None, command: str | None) -> None:
    """A run is continued by the trainer (`name`) and the command that started it: another
    preset is another method, and another trainer would read the options as its own."""
    record = Path(path) / RUN_RECORD
    if not record.exists():
        return
    try:
        saved = json.loads(record.read_text())
    except ValueError:
        return
    started = saved.get("command") or saved.get("trainer")
    if name is not None and saved.get("trainer") not in (None, name):
        raise RunDirError(f"--resume {path}: it is a {saved['trainer']} run; resume it with "
                          f"`lmpo train {started} --resume {path}`")
    if command is not None and saved.get("command") not in (None, command):
        raise RunDirError(f"--resume {path}: the run was started by `lmpo train {saved['command']}`; resume it "
                          f"with `lmpo train {saved['command']} --resume {path}`, not `lmpo train {command}`")


def trainer_of(command: str) -> str:
    """The trainer behind `lmpo train COMMAND` (every RL preset is the one RL loop)."""
    return command if command in ("cpt", "sft", "dpo", "online_dpo", "rm", "kto", "orpo", "rft") else "rl"


def saved_config(path: str | Path) -> dict:
    """The options a run was started with, from its `run.json` ({} when it has none)."""
    try:
        return json.loads((Path(path) / RUN_RECORD).read_text()).get("config") or {}
    except (OSError, ValueError, AttributeError):
        return {}


def check_resume(cfg, name: str) -> None:
    """With `--resume`: refuse a directory that is not there, or options that differ from the
    interrupted run's, before its data or any model loads (`open_run_dir` checks again, holding
    the directory's lock)."""
    if getattr(cfg, "resume", ""):
        path = Path(cfg.resume)
        if not path.is_dir():
            raise RunDirError(f"--resume {path}: " + ("not a directory" if path.exists() else "no such directory"))
        _check_resumed(path, cfg, name)


def _check_resumed(path: Path, cfg, name: str) -> None:
    check_resumable(path, name, _COMMAND[-1] if _COMMAND else None)
    recorded = saved_config(path)
    if recorded:  # every trainer, with or without a checkpoint
        compare_options(recorded, cfg, path)
    saved_config_file = path / "config.json"
    if name == "rl" and saved_config_file.is_file():
        try:
            saved = json.loads(saved_config_file.read_text())
        except ValueError:
            raise RunDirError(f"--resume {path}: {saved_config_file} is not valid JSON") from None
        compare_options(saved, cfg, path)
    check_finished_goes_on(path, recorded, json.loads(json.dumps(dataclasses.asdict(cfg))))


def compare_options(saved: dict, cfg, run_dir: str | Path) -> None:
    """Refuse a resumed run whose options differ from the saved ones, listing every difference.
    An option the saved run did not know (added later) counts as its default."""
    from lmpo.trainers.checkpoint import check_same_config

    current = json.loads(json.dumps(dataclasses.asdict(cfg)))
    defaults = json.loads(json.dumps(dataclasses.asdict(type(cfg)())))
    saved = {**{k: v for k, v in defaults.items() if k not in saved}, **saved}
    check_same_config(untrained_length(run_dir, saved, current), current, run_dir)


def write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as err:
        raise RunDirError(fs_error(path, err)) from None
