"""Running the (method, seed) runs of a comparison, each in a process of its own.

A process per run, because the peak memory a run reports (`VmHWM`, `lmpo.models.peak_rss_mb`) is
its process's: in one process every run would report the largest before it. (`ru_maxrss` would
not do even so: Linux hands a parent's peak to a child it starts.) Each run has its own directory,
OUT/seedS/METHOD, holding spec.json (what it runs), log.txt (its output) and the stage
directory with result.json. A run whose result.json exists is finished and skipped, so the same
command continues a killed comparison; an unfinished one is started again from scratch.

`python -m lmpo.teach.compare.execute RUN_DIR` runs one spec (what the parent starts).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import lmpo
from lmpo.teach.compare.plan import CompareConfig, Method, Plan, plan_method

SPEC = "spec.json"
LOG = "log.txt"


@dataclass
class RunSpec:
    config: CompareConfig
    method: Method
    seed: int
    start_model: str

    @property
    def run_dir(self) -> Path:
        return Path(self.config.out) / f"seed{self.seed}" / self.method.slug

    @property
    def stage_dir(self) -> Path:
        return self.run_dir / self.method.stage

    def plan(self) -> Plan:
        return plan_method(self.config, self.method, self.seed)

    @property
    def finished(self) -> bool:
        return (self.stage_dir / "result.json").is_file()

    def to_json(self) -> str:
        return json.dumps({"config": asdict(self.config), "method": self.method.name, "seed": self.seed,
                           "start_model": self.start_model}, indent=2)

    @classmethod
    def from_json(cls, text: str) -> "RunSpec":
        data = json.loads(text)
        return cls(CompareConfig(**data["config"]), Method.parse(data["method"]), int(data["seed"]),
                   data["start_model"])


def run_one(spec: RunSpec) -> None:
    """Train one method from its start, as the pipeline's last stage (in this process)."""
    from lmpo.trainers.pipeline import last_stage

    cfg = spec.plan().pipeline
    shared = {"task": cfg.task, "seed": cfg.seed, "threads": cfg.threads, "device": cfg.device,
              "precision": cfg.precision}
    last_stage(cfg, spec.start_model, spec.run_dir, shared)


def launch(spec: RunSpec) -> None:
    """Run `spec` in a child process unless it has finished; its output goes to log.txt."""
    if spec.finished:
        return
    if spec.run_dir.exists():  # killed midway: start again
        shutil.rmtree(spec.run_dir)
    spec.run_dir.mkdir(parents=True)
    (spec.run_dir / SPEC).write_text(spec.to_json())
    root = str(Path(lmpo.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    with open(spec.run_dir / LOG, "w") as log:
        code = subprocess.call([sys.executable, "-m", "lmpo.teach.compare.execute", str(spec.run_dir)],
                               stdout=log, stderr=subprocess.STDOUT, env=env)
    if code != 0 or not spec.finished:
        tail = (spec.run_dir / LOG).read_text(errors="replace").strip().splitlines()[-5:]
        raise RuntimeError(f"compare: {spec.method.name} (seed {spec.seed}) failed with exit code {code}; "
                           f"see {spec.run_dir / LOG}:\n  " + "\n  ".join(tail))


def main(argv: list[str]) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    run_one(RunSpec.from_json((Path(argv[0]) / SPEC).read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
