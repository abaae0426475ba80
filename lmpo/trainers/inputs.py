"""What a run read, so that `--resume` continues on the same inputs, fingerprinted when the run
starts and kept in every checkpoint; a changed input is refused like a changed option.

- Each data file named by an option (size and SHA-256 of its bytes). The data order a
  checkpoint restores is a position in that file's rows; resumed over an edited file, the run
  would silently train on other examples than its schedule counts.
- Each model directory named by an option (`--model`, `--reward_model`): its small files'
  SHA-256 (config, tokenizer) and its weight files' size and modification time (hashing
  gigabytes at every start would cost more than it saves). A resumed run takes its reference
  model, a LoRA run its base weights, from `--model`: rewritten since (an SFT run repeated into
  the same directory, say), the run would silently go on from other weights. A LoRA adapter's
  directory given as a model is read on top of the base model it names: that one too."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from lmpo.models.lora import adapter_base_name, is_adapter_dir
from lmpo.models.presets import is_preset

DATA_OPTIONS = ("data", "heldout_data", "prompts", "eval_prompts", "ptx_data", "chat_template")
"""Options that name a file (JSONL, Parquet, a Jinja template) or a `datasets` directory (`DIR::split`) to read."""
MODEL_OPTIONS = ("model", "reward_model")
"""Options that name a model: a local directory, or a preset's or hub's name (not fingerprinted)."""
SMALL_FILE = 1 << 20  # hashed; larger files (weights) are known by size and modification time

_CHUNK = 1 << 20
_cache: dict[tuple, str] = {}  # (path, size, mtime_ns) -> digest: a resumed run hashes each file once


def input_fingerprints(cfg) -> dict[str, dict]:
    """{option: {"path", "bytes", "sha256"}} for each data option of `cfg` that names a local file
    or directory (others are left to the loaders, which say what is wrong)."""
    out = {}
    for option in DATA_OPTIONS:
        value = getattr(cfg, option, "") or ""
        path = Path(value.split("::", 1)[0])
        if value and path.exists():
            size, digest = _fingerprint(path)
            out[option] = {"path": value, "bytes": size, "sha256": digest}
    for option in MODEL_OPTIONS:
        value = getattr(cfg, option, "") or ""
        if value and Path(value).is_dir() and not is_preset(value):  # a scratch ./tiny is not the model
            out[option] = {"path": value, "files": _model_files(Path(value))}
            base = _adapter_base(Path(value))
            if base is not None:  # a LoRA adapter's directory: its weights sit on this base's
                out[f"{option} base"] = {"path": str(base), "files": _model_files(base)}
    return out


def _adapter_base(path: Path) -> Path | None:
    """The local base model directory that an adapter directory names, as loading resolves it
    (`lmpo.models.lora`), else None (not an adapter, or a base that is a preset or a hub id)."""
    if not is_adapter_dir(path):
        return None
    try:
        base = Path(adapter_base_name(path))
    except (OSError, ValueError):
        return None  # loading says what is wrong with it
    return base if base.is_dir() else None


def check_same_inputs(saved: dict | None, current: dict, run_dir: str | Path) -> None:
    """Refuses a resume whose data files differ from the interrupted run's (`saved` is None for
    checkpoints written before fingerprints were kept: nothing to compare)."""
    if saved is None:
        return
    models = {key for key, value in (saved | current).items() if "files" in value}
    for option in sorted(models):
        if option in saved and option in current:
            _check_same_model(option, saved[option], current[option], run_dir)
    changed = [f"--{option} {now['path'] if now else old['path']}: {_describe(old)} then, {_describe(now)} now"
               for option in sorted((saved.keys() | current.keys()) - models)
               for old, now in [(saved.get(option), current.get(option))]
               if (old or {}).get("sha256") != (now or {}).get("sha256")]
    if changed:
        raise ValueError(f"--resume {run_dir}: the run's data changed since it started ({'; '.join(changed)}); "
                         f"the checkpoint's place in the data would point at other rows. Restore the data, or "
                         f"start afresh on it with `--out {run_dir} --overwrite true` instead of --resume")


def _check_same_model(option: str, saved: dict, current: dict, run_dir) -> None:
    was, now = saved["files"], current["files"]
    changed = {name: _file_change(was.get(name), now.get(name)) for name in sorted(was.keys() | now.keys())
               if was.get(name) != now.get(name)}
    if not changed:
        return
    hint = ""
    if all(was.get(n) and now.get(n) and was[n]["bytes"] == now[n]["bytes"] and "mtime_ns" in was[n]
           for n in changed):  # only times moved: perhaps copied without them
        times = " ".join(f"-d @{was[n]['mtime_ns'] // 10**9}.{was[n]['mtime_ns'] % 10**9:09d} "
                         f"{Path(saved['path']) / n}" for n in changed)
        hint = f"; if the weights are the same (copied without their times), give them their times back: touch {times}"
    listed = ", ".join(f"{name} {what}" for name, what in changed.items())
    named = f"--{option} {saved['path']}"
    if option.endswith(" base"):
        named = f"the base model {saved['path']} of the adapter given as --{option.removesuffix(' base')}"
    if (writer := _rewritten_by_run(Path(current["path"]), Path(run_dir))) is not None:
        raise ValueError(f"--resume {run_dir}: {named} changed since the run started ({listed}): it is the model of "
                         f"the run {writer}, which wrote it again after this run started (resumed or extended, or "
                         f"run again: its result.json is newer), so the weights this run started from (its "
                         f"reference model, a LoRA run's base) are gone; start this run afresh from the new model "
                         f"with `--out {run_dir} --overwrite true` instead of --resume")
    raise ValueError(f"--resume {run_dir}: {named} changed since the run started ({listed}); "
                     f"the run would go on from other weights than its own (its reference model, a LoRA run's "
                     f"base). Restore that model{hint}")


def _rewritten_by_run(model: Path, run_dir: Path) -> Path | None:
    """The run whose `model/` `model` is, when that run finished (its result.json) after the run
    being resumed started (its run.json): that run rewrote it, so no earlier copy's times can be
    given back. None otherwise."""
    writer = model.parent
    try:
        finished, started = (writer / "result.json").stat().st_mtime_ns, (run_dir / "run.json").stat().st_mtime_ns
    except OSError:
        return None
    return writer if model.name == "model" and (writer / "run.json").is_file() and finished > started else None


def _file_change(was: dict | None, now: dict | None) -> str:
    if was is None:
        return "is new"
    if now is None:
        return "is gone"
    if was["bytes"] != now["bytes"]:
        return f"has {now['bytes']:,} bytes, had {was['bytes']:,}"
    if "mtime_ns" in was:
        return "was rewritten (another modification time)"
    return "has other bytes"


def _model_files(path: Path) -> dict[str, dict]:
    files = {}
    for file in sorted(path.iterdir()):
        if file.is_file() and not file.name.startswith("."):
            stat = file.stat()
            files[file.name] = ({"bytes": stat.st_size, "sha256": _file_digest(file, stat)}
                                if stat.st_size <= SMALL_FILE else {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns})
    return files


def _describe(fingerprint: dict | None) -> str:
    if not fingerprint:
        return "not given"
    return f"{fingerprint['bytes']:,} bytes, sha256 {fingerprint['sha256'][:12]}"


def _fingerprint(path: Path) -> tuple[int, str]:
    """(bytes, SHA-256) of a file, or of a directory's files (each one's relative path and
    digest, in path order)."""
    if path.is_file():
        stat = path.stat()
        return stat.st_size, _file_digest(path, stat)
    digest, total = hashlib.sha256(), 0
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        stat = file.stat()
        total += stat.st_size
        digest.update(f"{file.relative_to(path)}\0{_file_digest(file, stat)}\n".encode())
    return total, digest.hexdigest()


def _file_digest(file: Path, stat: os.stat_result) -> str:
    key = (str(file.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _cache:
        digest = hashlib.sha256()
        with open(file, "rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
        _cache[key] = digest.hexdigest()
    return _cache[key]
