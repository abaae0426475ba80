"""`lmpo eval`: a model's held-out accuracy without training it, measured as every trainer measures
it (greedy episodes through the agent loop, graded by the task's grader), so a stage's final model
scores here what its run reported; with `out`, every episode written for `lmpo trajectories`."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from lmpo.rollout.evaluation import EvalResult, evaluate
from lmpo.rollout.types import SamplingParams
from lmpo.trainers.agent_metrics import trajectory_row
from lmpo.trainers.prompts import PromptColumns
from lmpo.trainers.validation import ConfigError, at_least, single_turn_problems

EVAL_FILE = "eval.json"
TRAJECTORIES_FILE = "trajectories.jsonl"  # as a run directory's, so `lmpo trajectories DIR` reads it


@dataclass
class EvalConfig(PromptColumns):
    """A held-out evaluation of one model."""

    prompt_field: str = "prompt"
    """The column of --eval_prompts holding each prompt (e.g. question, for GSM8K's)."""
    answer_field: str = "answer"
    """The column of --eval_prompts holding each answer, for the grader."""

    model: str = "runs/pipeline/grpo/model"
    """Model to evaluate: a Hugging Face model directory (a stage's model/, a checkpoint, a LoRA adapter directory) or a preset name."""
    task: str = "sort_digits"
    """Task whose grader scores the episodes, and whose held-out split is evaluated without --eval_prompts: a built-in name with options (`exact_match:extract=boxed,math=1`), an installed plugin, `module:Class` or `path/to/file.py:Class` (docs/tasks.md)."""
    eval_prompts: str = ""
    """Evaluate on the prompts of this file (JSONL, JSON, Parquet, CSV/TSV (those but Parquet also .gz/.bz2/.xz) or a `datasets` directory, `DIR::split`) instead of the task's held-out split: a `prompt` column and, for exact_match, an `answer` column (other names with --prompt_field, --answer_field)."""
    eval_problems: int = 500
    """How many: the first N rows of --eval_prompts, or the task's first N held-out problems (as the trainers' eval_problems)."""
    max_new_tokens: int = 12
    """Tokens the model may write per episode (per turn in agent tasks); a task with an episode budget suggests its own (as the trainers' eval_max_new_tokens)."""
    max_turns: int = 0
    """Agent tasks: the most model turns per episode (0 = the task's own limit), as in RL."""
    max_turn_tokens: int = 0
    """Agent tasks: the most tokens per turn (0 = max_new_tokens), as in RL."""
    max_parse_errors: int = 3
    """Agent tasks: end an episode after this many malformed tool calls, as in RL."""
    samples: int = 0
    """0: one greedy episode per problem, as the trainers evaluate. K >= 1: K episodes per problem sampled at --temperature (--top_p, --top_k), reporting pass@k for k = 1, 2, 4, ... and K (the unbiased estimator of Chen et al. 2021); accuracy is then pass@1."""
    temperature: float = 1.0
    """With --samples: the sampling temperature (> 0)."""
    top_p: float = 1.0
    """With --samples: nucleus sampling's probability mass (1 = off)."""
    top_k: int = 0
    """With --samples: sample among the k likeliest tokens only (0 = off)."""
    batch_size: int = 256
    """Episodes generated together."""
    out: str = ""
    """A directory for eval.json (the figures and the options) and trajectories.jsonl (every episode, for `lmpo trajectories DIR --failed`); empty = print only."""
    show: int = 3
    """Episodes to print after the figures (the first ones, failed ones first)."""
    device: str = "auto"
    """Where to run: auto (a CUDA GPU when one is visible, else the CPU), cpu, cuda or cuda:N."""
    threads: int = 2
    """CPU threads (0 = one per available core)."""
    seed: int = 0
    """Seed of the sampling (--samples) and of a preset model's fresh weights."""
    trust_remote_code: bool = False
    """Run the Python code a model directory ships to load it (only for code you have read)."""
    chat_template: str = ""
    """A Jinja chat template file that replaces the tokenizer's own, as the trainers' --chat_template."""
    chat_template_kwargs: str = ""
    """A JSON object of the chat template's variables, as the trainers' --chat_template_kwargs."""


def config_problems(cfg: EvalConfig) -> list[str]:
    problems = at_least(cfg, 1, "eval_problems", "max_new_tokens", "batch_size", "max_parse_errors")
    problems += at_least(cfg, 0, "max_turns", "max_turn_tokens", "show", "samples", "top_k", "threads")
    if cfg.samples and not cfg.temperature > 0:
        problems.append(f"temperature={cfg.temperature} must be > 0 with samples={cfg.samples} (greedy is samples=0)")
    if not 0 < cfg.top_p <= 1:
        problems.append(f"top_p={cfg.top_p} must be in (0, 1]")
    if not cfg.samples:  # greedy episodes read none of these: a value given would be ignored in silence
        defaults = EvalConfig()
        given = [f"{name}={getattr(cfg, name)}" for name in ("temperature", "top_p", "top_k")
                 if getattr(cfg, name) != getattr(defaults, name)]
        if given:
            problems.append(f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} --samples K "
                            f"(samples=0 evaluates greedily, without sampling)")
    return problems


@dataclass
class EvalRun:
    result: EvalResult
    """The figures, every episode and its grade."""
    rows: list[dict]
    """Every episode as `trajectories.jsonl` holds it (`lmpo.trainers.agent_metrics.trajectory_row`)."""
    seconds: float


def eval_model(cfg: EvalConfig) -> EvalRun:
    """Evaluate `cfg.model`, writing `cfg.out` where given."""
    problems = config_problems(cfg)
    if problems:
        raise ConfigError(f"invalid eval config: {'; '.join(problems)}")
    import torch

    from lmpo.envs import make_task
    from lmpo.models import load_model, load_tokenizer
    from lmpo.models.device import resolve_device, without_cpu_hub_kernels
    from lmpo.trainers.preflight import prompts_within_context
    from lmpo.trainers.progress import StageProgress
    from lmpo.trainers.runtime import setup_torch

    started = time.perf_counter()
    task = make_task(cfg.task)
    if problems := single_turn_problems(cfg, task):
        raise ConfigError(f"invalid eval config: {'; '.join(problems)}")
    device = resolve_device(cfg.device)
    tokenizer = load_tokenizer(cfg.model, cfg.trust_remote_code, cfg.chat_template, cfg.chat_template_kwargs)
    if cfg.eval_prompts:  # read and checked before the model loads
        heldout = prompts_within_context(cfg, cfg.eval_prompts, tokenizer, cfg.max_new_tokens, "max_new_tokens",
                                         "eval")[: cfg.eval_problems]
    else:
        try:
            heldout = task.heldout_problems(cfg.eval_problems)
        except ValueError as err:  # a task of users' files: the trainers' alternative of no evaluation is none here
            raise ValueError(str(err).replace(" or --eval_problems 0", "")) from None
    out = Path(cfg.out) if cfg.out else None
    if out is not None:
        _check_out(out)
        out.mkdir(parents=True, exist_ok=True)
    threads = setup_torch(cfg.threads, cfg.seed)
    model = load_model(cfg.model, tokenizer, seed=cfg.seed, trust_remote_code=cfg.trust_remote_code).to(device)
    without_cpu_hub_kernels(model)
    model.eval()
    source = cfg.eval_prompts or f"the held-out split of {cfg.task}"
    how = (f"{cfg.samples} samples each at temperature {cfg.temperature:g}" if cfg.samples else "greedy")
    print(f"[eval] {cfg.model}: {len(heldout)} problems from {source}, {how}, up to {cfg.max_new_tokens} new tokens, "
          f"{device}, {threads} threads")
    sampled = {}
    if cfg.samples:
        sampled = {"sampling": SamplingParams(cfg.temperature, cfg.top_p, cfg.top_k, cfg.max_new_tokens),
                   "samples": cfg.samples, "generator": torch.Generator().manual_seed(cfg.seed)}
    with torch.no_grad(), StageProgress("eval", len(heldout) * max(cfg.samples, 1), unit="episode") as progress:
        result = evaluate(model, tokenizer, task, heldout, max_new_tokens=cfg.max_new_tokens,
                          batch_size=cfg.batch_size, n_examples=cfg.show, max_turns=cfg.max_turns,
                          max_turn_tokens=cfg.max_turn_tokens, max_parse_errors=cfg.max_parse_errors, keep_all=True,
                          on_batch=lambda done, accuracy: progress.update(done, accuracy=accuracy), **sampled)
    rows = [trajectory_row(t, g, float(g.correct), tokenizer, 0, "eval", i)
            for i, (t, g) in enumerate(zip(result.trajectories, result.grades))]
    seconds = time.perf_counter() - started
    if out is not None:
        with (out / TRAJECTORIES_FILE).open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
        summary = {**result.as_dict(), "seconds": round(seconds, 2), "options": asdict(cfg)}
        (out / EVAL_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return EvalRun(result, rows, seconds)


def _check_out(out: Path) -> None:
    """`out` may be new or an earlier evaluation's; a training run's directory (its own
    trajectories.jsonl) or a file is refused rather than written over."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a directory")
    if (out / "run.json").exists() or ((out / TRAJECTORIES_FILE).exists() and not (out / EVAL_FILE).exists()):
        raise ConfigError(f"--out {out} holds a training run, whose {TRAJECTORIES_FILE} an evaluation would "
                          "replace; give another directory")
