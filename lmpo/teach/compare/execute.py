"""Running the (method, seed) runs of a comparison, each in a process of its own.

A process per run, because the peak memory a run reports (`VmHWM`, `lmpo.models.peak_rss_mb`) is
its process's: in one process every run would report the largest before it. (`ru_maxrss` would
not do even so: Linux hands a parent's peak to a child it starts.) Each run has its own directory,
OUT/seedS/METHOD, holding spec.json (what it runs), log.txt (its output) and the stage
directory with result.json. A run whose result.json exists is finished and skipped, so the same
command continues a killed comparison; an unfinished one is started again from scratch.

`main([RUN_DIR])` runs one spec, in the process the parent starts (`child_command`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import lmpo
from lmpo.teach.compare.plan import CompareConfig, Method, Plan, plan_method
from lmpo.teach.compare.records import NO_STEPS
from lmpo.teach.compare.texts import tx

SPEC = "spec.json"
LOG = "log.txt"


class RunFailed(RuntimeError):
    """A run's process ended in an error: said as the error line of `lmpo compare` (`cmd_compare`),
    with the end of its log.txt."""


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
        return (self.stage_dir / "result.json").is_file() or (self.run_dir / NO_STEPS).is_file()

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


def launch(spec: RunSpec, say: Callable[[str], None] | None = None, every_s: float = 20.0) -> None:
    """Run `spec` in a child process unless it has finished; its output goes to log.txt, and
    `say` gets the run's newest progress line (`step 120/250`) every `every_s` seconds."""
    if spec.finished:
        return
    if spec.run_dir.exists():  # killed midway: start again
        shutil.rmtree(spec.run_dir)
    spec.run_dir.mkdir(parents=True)
    (spec.run_dir / SPEC).write_text(spec.to_json())
    root = str(Path(lmpo.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    with open(spec.run_dir / LOG, "w") as log:
        child = subprocess.Popen(child_command(spec.run_dir), stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            code = follow(child, spec.run_dir / LOG, say, every_s)
        except BaseException:  # SIGTERM (Terminated), Ctrl-C, an error: no run left writing after we are gone
            stop(child)
            raise
    if code != 0 or not spec.finished:
        tail = (spec.run_dir / LOG).read_text(errors="replace").strip().splitlines()[-5:]
        raise RunFailed(tx("run_failed", spec.config.lang, method=spec.method.name, seed=spec.seed, code=code,
                              log=spec.run_dir / LOG, tail="\n  ".join(tail)))


def child_command(run_dir: Path) -> list[str]:
    # not `-m lmpo.teach.compare.execute`: the package imports this module first, and runpy then
    # warns in every run's log.txt that it found it in sys.modules ("unpredictable behaviour")
    return [sys.executable, "-c", "import sys; from lmpo.teach.compare.execute import main; sys.exit(main(sys.argv[1:]))",
            str(run_dir)]


def stop(child: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Terminate `child` and wait for it (killed if it has not ended after `grace_s`)."""
    if child.poll() is not None:
        return
    child.terminate()
    try:
        child.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


PROGRESS = re.compile(r"\[\w+\] (step|round) (\d+)/(\d+)")


def follow(child: subprocess.Popen, log: Path, say: Callable[[str], None] | None, every_s: float) -> int:
    """Wait for `child`; meanwhile hand `say` the newest progress line its log has gained (a
    trainer's `[rl] step 120/250 ...`), at most every `every_s` seconds. Its exit code."""
    started, last = time.monotonic(), ""
    while True:
        try:
            return child.wait(timeout=every_s)
        except subprocess.TimeoutExpired:
            pass
        if say is None:
            continue
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            tail = f.read().decode("utf-8", "replace")
        found = [m for m in PROGRESS.finditer(tail)]
        if found and found[-1].group(0) != last:
            last = found[-1].group(0)
            line = tail[found[-1].start():].splitlines()[0].strip()
            say(f"{line.partition('] ')[2]} ({time.monotonic() - started:.0f} s)")


def main(argv: list[str]) -> int:
    """Run one spec. A run whose reference log-prob pass alone outlasted the time budget trained 0
    steps: that is its result at this budget (the comparison goes on, and says so), not a failure."""
    from lmpo.models import peak_rss_mb
    from lmpo.trainers.reference_pass import StoppedBeforeTraining

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    spec, started = RunSpec.from_json((Path(argv[0]) / SPEC).read_text()), time.monotonic()
    try:
        run_one(spec)
    except StoppedBeforeTraining as stop:
        if stop.code == 143:  # SIGTERM: the comparison was stopped, nothing to record
            print(f"lmpo: {stop}", file=sys.stderr)
            return 143
        seconds = time.monotonic() - started
        # the trainer's "(no model written)" and kept log-probs are for a resume; here the run is a result
        stopped = str(stop).partition(" (no model written)")[0]
        (spec.run_dir / NO_STEPS).write_text(json.dumps({
            "stopped": stopped, "seconds": seconds, "peak_rss_mb": peak_rss_mb()}))
        print(tx("no_steps_log", spec.config.lang, method=spec.method.name, seconds=seconds, stopped=stopped,
                 minutes=spec.config.minutes), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
