"""What a run read, so that `--resume` continues on the same inputs: each data file named by an
option, fingerprinted (size and SHA-256 of its bytes) when the run starts and kept in every
checkpoint. The data order a checkpoint restores is a position in that file's rows; resumed
over an edited file, the run would silently train on other examples than its schedule counts,
so a changed file is refused like a changed option."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

DATA_OPTIONS = ("data", "heldout_data", "prompts", "eval_prompts", "ptx_data")
"""Options that name a file (JSONL, Parquet) or a `datasets` directory (`DIR::split`) to read."""

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
    return out


def check_same_inputs(saved: dict | None, current: dict, run_dir: str | Path) -> None:
    """Refuses a resume whose data files differ from the interrupted run's (`saved` is None for
    checkpoints written before fingerprints were kept: nothing to compare)."""
    if saved is None:
        return
    changed = [f"--{option} {now['path'] if now else old['path']}: {_describe(old)} then, {_describe(now)} now"
               for option in sorted(saved.keys() | current.keys())
               for old, now in [(saved.get(option), current.get(option))]
               if (old or {}).get("sha256") != (now or {}).get("sha256")]
    if changed:
        raise ValueError(f"--resume {run_dir}: the run's data changed since it started ({'; '.join(changed)}); "
                         f"the checkpoint's place in the data would point at other rows. Restore the data, or "
                         f"start afresh on it with `--out {run_dir} --overwrite true` instead of --resume")


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
