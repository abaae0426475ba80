"""The pipeline's options: its own (model, task, seed, ...) and one section per stage (`cpt`,
`sft`, `rl_stage`, `dpo`, ...), and how a stage's messages name them."""

from __future__ import annotations

import contextlib
import dataclasses
import re
from dataclasses import dataclass, field
from typing import Iterator

from lmpo.trainers.kto import KTOConfig
from lmpo.trainers.online_dpo import OnlineDPOConfig
from lmpo.trainers.orpo import ORPOConfig
from lmpo.trainers.preference import PreferenceConfig
from lmpo.trainers.reward_model import RewardModelConfig
from lmpo.trainers.rft import RFTConfig
from lmpo.trainers.rl_config import RLConfig
from lmpo.trainers.supervised import CPTConfig, SFTConfig
from lmpo.trainers.validation import ConfigError


@dataclass
class PipelineConfig:
    out: str = "runs/pipeline"
    """Run directory: one sub-directory per stage, summary.json and the report."""
    resume: str = ""
    """Directory of an interrupted pipeline to continue with its options: its finished stages are kept, the interrupted stage resumes from its newest checkpoint, and the stages after it run."""
    overwrite: bool = False
    """Start afresh in an --out that holds an interrupted pipeline (finished stages, a stage's checkpoints), deleting its stages; without it such a start is refused (continue it with --resume). A finished pipeline in --out is replaced either way."""
    model: str = "tiny"
    """Model preset (fresh weights) or Hugging Face model directory for the first stage."""
    task: str = "sort_digits"
    """Task for every stage and for the held-out evaluation: a built-in name (`sort_digits:length=6`), an installed plugin, `module:Class` or `path/to/file.py:Class`, options after `?` (docs/tasks.md)."""
    seed: int = 0
    """Seed for every stage."""
    threads: int = 2
    """Torch CPU threads for every stage (0 = one per core)."""
    device: str = "auto"
    """Where every stage trains: auto (a CUDA GPU when one is visible), cpu, cuda or cuda:N."""
    precision: str = "auto"
    """Precision of every stage: auto (bf16 autocast on GPUs that support it, else fp32), fp32 or bf16."""
    adaptive: bool = True
    """Adaptive budgets (`ADAPTIVE_BUDGETS`): CPT stops when its held-out loss stops improving and RL when its held-out accuracy does, each keeping its best model, with the step counts and a wall-time cap as maxima; False = every step of the fixed budgets."""
    rl: str = "grpo"
    """Last stage: an RL preset (see `lmpo presets`), dpo, online_dpo, kto, orpo, rft (rejection-sampling fine-tuning), or ppo_rm (reward model, then PPO on it); the stage is named after it."""
    cpt: CPTConfig = field(default_factory=CPTConfig)
    """Continued pre-training options (the pipeline sets model, out, task, seed and threads)."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Supervised fine-tuning options (the pipeline sets model, out, task, seed and threads)."""
    rl_stage: RLConfig = field(default_factory=RLConfig)
    """The RL stage, on top of the preset (model, out, task, seed and threads are set by the pipeline)."""
    dpo: PreferenceConfig = field(default_factory=PreferenceConfig)
    """The last stage when --rl dpo (the pipeline sets model, out, task, seed and threads)."""
    online_dpo: OnlineDPOConfig = field(default_factory=OnlineDPOConfig)
    """The last stage when --rl online_dpo (the pipeline sets model, out, task, seed and threads)."""
    kto: KTOConfig = field(default_factory=KTOConfig)
    """The last stage when --rl kto (the pipeline sets model, out, task, seed and threads)."""
    orpo: ORPOConfig = field(default_factory=ORPOConfig)
    """The last stage when --rl orpo (the pipeline sets model, out, task, seed and threads)."""
    rm: RewardModelConfig = field(default_factory=RewardModelConfig)
    """The reward model trained when --rl ppo_rm (the pipeline sets model, out, task, seed and threads)."""
    rft: RFTConfig = field(default_factory=RFTConfig)
    """The last stage when --rl rft (the pipeline sets model, out, task, seed and threads)."""


SECTIONS = frozenset(f.name for f in dataclasses.fields(PipelineConfig) if f.default_factory is not dataclasses.MISSING)
"""The stages' option sections (cpt, sft, rl_stage, dpo, ...)."""
PIPELINE_OPTIONS = frozenset(f.name for f in dataclasses.fields(PipelineConfig)) - SECTIONS
"""The pipeline's own options (--model, --seed, ...): a stage's message naming one names the
pipeline's flag."""


def stage_section(stage: str) -> str:
    """The option section of a stage, by its name (its directory's): cpt, sft, dpo, ..., rm; an RL
    preset's (grpo, ppo, ...) is rl_stage."""
    return stage if stage in SECTIONS and stage != "rl_stage" else "rl_stage"


def as_pipeline_flags(text: str, stage: str) -> str:
    """A stage's messages (its refusals, the doctor's remedies) name its own flags
    (`--max_new_tokens`); inside the pipeline they are its section's (`--rl_stage.max_new_tokens`:
    `lmpo pipeline --max_new_tokens` does not exist)."""
    section = stage_section(stage)
    names = {f.name for f in dataclasses.fields(getattr(PipelineConfig(), section))} - PIPELINE_OPTIONS
    return re.sub(r"(?<![\w.-])--([a-z_][a-z0-9_]*)(?![\w.])",
                  lambda m: f"--{section}.{m[1]}" if m[1] in names else m[0], text)


@contextlib.contextmanager
def flags_of_stage(stage: str) -> Iterator[None]:
    """A refusal raised inside the block names the stage's options as `as_pipeline_flags` does."""
    try:
        yield
    except (ValueError, ConfigError) as err:
        if err.args and isinstance(err.args[0], str):
            err.args = (as_pipeline_flags(err.args[0], stage), *err.args[1:])
        raise
