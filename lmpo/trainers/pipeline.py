"""CPT → SFT → RL on one task, with held-out accuracy and wall time after each stage."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from lmpo.trainers.result import StageResult
from lmpo.trainers.rl import train_rl
from lmpo.trainers.rl_config import RLConfig
from lmpo.trainers.supervised import CPTConfig, SFTConfig, train_cpt, train_sft


@dataclass
class PipelineConfig:
    out: str = "runs/pipeline"
    """Run directory: one sub-directory per stage, summary.json and the report."""
    model: str = "tiny"
    """Model preset (fresh weights) or Hugging Face model directory for the first stage."""
    task: str = "sort_digits"
    """Task for every stage and for the held-out evaluation."""
    seed: int = 0
    """Seed for every stage."""
    threads: int = 2
    """Torch CPU threads for every stage (0 = one per core)."""
    rl: str = "grpo"
    """RL preset of the last stage; the stage is named after it."""
    cpt: CPTConfig = field(default_factory=CPTConfig)
    """Continued pre-training options (the pipeline sets model, out, task, seed and threads)."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Supervised fine-tuning options (the pipeline sets model, out, task, seed and threads)."""
    rl_stage: RLConfig = field(default_factory=RLConfig)
    """The RL stage, on top of the preset (model, out, task, seed and threads are set by the pipeline)."""


def run_pipeline(cfg: PipelineConfig) -> list[StageResult]:
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2))
    shared = {"task": cfg.task, "seed": cfg.seed, "threads": cfg.threads}
    cpt = replace(cfg.cpt, model=cfg.model, out=str(out / "cpt"), **shared)
    cfg.rl_stage.validate()
    results = [train_cpt(cpt)]
    _report_stage(results[-1])
    sft = replace(cfg.sft, model=results[-1].model_dir, out=str(out / "sft"), **shared)
    results.append(train_sft(sft))
    _report_stage(results[-1])
    rl = replace(cfg.rl_stage, model=results[-1].model_dir, out=str(out / cfg.rl), resume="", **shared)
    result = train_rl(rl)
    result.name = cfg.rl
    results.append(result)
    _report_stage(result)
    write_summary(out, results)
    return results


def _report_stage(result: StageResult) -> None:
    print(f"[pipeline] {result.name}: held-out accuracy {100 * (result.accuracy or 0):.1f}%, "
          f"format {100 * (result.format_accuracy or 0):.1f}%, {result.seconds:.1f} s")


def write_summary(out: Path, results: list[StageResult]) -> Path:
    stages = [{"name": r.name, "accuracy": r.accuracy, "format_accuracy": r.format_accuracy,
               "seconds": round(r.seconds, 2), "run_dir": Path(r.run_dir).name, "model_dir": r.model_dir}
              for r in results]
    path = out / "summary.json"
    path.write_text(json.dumps({"stages": stages, "total_seconds": round(sum(r.seconds for r in results), 2),
                                "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=2))
    return path
