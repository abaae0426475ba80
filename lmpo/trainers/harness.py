"""One run harness for every trainer: what a run does besides its loop body.

`Run(cfg, name)` opens the run directory (lock, options check on resume), joins torchrun's
process group when there is one, fixes threads and seeds, chooses the device and precision,
and then serves the loop body: `prepare` (device, gradient checkpointing, LoRA), `reference`
(a frozen copy, or the same model with its adapter disabled), `resume`, `write` (metrics
file and trackers, rank 0 only), `progress`, `checkpoint`, and `finish` (final model, result
file). `Updater` is the one place where a loss becomes an optimizer step: backward, clipping,
the non-finite skip and its streak limit, the step and the schedule.

Each trainer keeps only its loop body: batches, the loss, its figures.
"""

from __future__ import annotations

import shutil
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

import torch

from lmpo.models import (AdapterDisabled, LoraOptions, apply_lora, autocast, check_compiler, check_model_source,
                         choose_precision, compile_blocks, enable_gradient_checkpointing, is_peft_model, load_model,
                         parameter_counts, peak_rss_mb, resolve_device, save_model, without_cpu_hub_kernels)
from lmpo.trainers.checkpoint import (SHARDED, Resumed, check_resume_inputs, checkpoint_dir, is_write_failure,
                                      resume_advice, resume_training, save_checkpoint, sharded_checkpoint_dir)
from lmpo.trainers.distributed import Distributed, unwrap, wrap_data_parallel
from lmpo.trainers.fsdp import plain_copy, refresh, save_sharded, shard_model
from lmpo.trainers.inputs import input_fingerprints
from lmpo.trainers.preemption import Preempted, stop_requested
from lmpo.trainers.progress import StageProgress
from lmpo.trainers.result import StageResult
from lmpo.trainers.resume_changes import CAP_STOP
from lmpo.trainers.run_clock import STATE_KEY, RunClock
from lmpo.trainers.fs_faults import fs_error
from lmpo.trainers.run_dir import RunDirError, check_resume, open_run_dir, replace_directory, staging_directory
from lmpo.trainers.runtime import MetricsLog, setup_torch
from lmpo.trainers.trackers import Trackers
from lmpo.trainers.updater import NonFiniteUpdates, Updater  # noqa: F401 (the harness's API)
from lmpo.trainers.validation import raise_if_any, run_option_problems


@dataclass
class RunOptions:
    """Options every trainer shares: hardware, precision, LoRA, trackers, the non-finite guard."""

    device: str = "auto"
    """Where to train: auto (a CUDA GPU when one is visible, else the CPU), cpu, cuda or cuda:N."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """auto: bf16 autocast on GPUs that support it (fp32 master weights and optimizer state), fp32 on CPUs; bf16 on a CPU without native bf16 warns and runs fp32."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass instead of keeping them (less memory, ~30% more compute)."""
    lora_r: int = 0
    """LoRA rank (0 = train every weight). With LoRA the reference is the base model with the adapter disabled, so no second copy is held."""
    lora_alpha: float = 16.0
    """LoRA scaling numerator (the update is scaled by alpha / r)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA branch's input."""
    lora_target_modules: str = "all-linear"
    """Modules that get adapters: all-linear, or comma-separated names such as q_proj,v_proj."""
    lora_merge: bool = False
    """Also save the merged full model (model/merged/) beside the adapter (model/) at the end."""
    qlora: bool = False
    """Load the frozen base in 4 bits (bitsandbytes on CUDA) under the LoRA adapter."""
    logprob_chunk_tokens: int = 0
    """RL only: apply the output head to at most this many completion tokens at a time (each chunk recomputed in the backward), in the update and the reference and critic forwards, so full-vocabulary logits never exist for a whole batch; 0 = all at once. One process only."""
    fsdp: bool = False
    """With torchrun: shard weights, gradients and optimizer state over the processes (FSDP2 fully_shard) instead of replicating them (DDP); checkpoints become distributed checkpoints."""
    report_to: str = ""
    """Trackers beside metrics.jsonl, comma-separated: tensorboard, wandb, trackio (each needs its package)."""
    compile_blocks: bool = False
    """Compile the model's RMSNorms and MLPs with torch.compile (inductor, dynamic shapes; attention stays eager): measured at most a few percent faster (README), seconds of compiling in the first step; needs a C++ compiler on the CPU. See lmpo/models/compile.py."""
    max_nonfinite_steps: int = 3
    """Stop with an error after this many consecutive steps whose loss or gradient was not finite (each is skipped)."""
    trust_remote_code: bool = False
    """Run the Python code a model directory ships (its config's `auto_map`) to load its model and tokenizer; without it such a model is refused. Only for code you have read: loading runs it. vLLM, where it samples, is given it too."""
    chat_template: str = ""
    """A Jinja chat template file that replaces the tokenizer's own (or gives a base model one), for the data, the prompts and the saved model, so later stages use it too: Qwen3's with thinking off, say, or a ChatML template for a base model without one."""
    chat_template_kwargs: str = ""
    """A JSON object of the chat template's variables, e.g. '{"enable_thinking": false}' for Qwen3 without thinking: written into the template (a `{% set %}` per key at its top), so the data, the prompts, the rollouts and the saved model all render with them."""
    overwrite: bool = False
    """Start afresh in an --out that holds an interrupted run's checkpoints, deleting them; without it such a start is refused (continue that run with --resume). A finished run in --out is replaced either way."""


def preflight_run(cfg, name: str) -> tuple[torch.device, Distributed]:
    """Every check `Run` makes before it writes anything: the shared options, the device, the
    processes torchrun started, where the model comes from and, with `--resume`, the options
    against the interrupted run's (the model is the one that run trained). A trainer calls it
    before reading its data too, so a wrong option or model is said before a long data load.
    Returns the device and the process group."""
    raise_if_any(name, run_option_problems(cfg, name), cfg)
    device = resolve_device(cfg.device)
    ctx = Distributed.from_env(device.type == "cuda")
    if ctx.active and device.type == "cuda":
        device = torch.device("cuda", ctx.local_rank)
    _check_parallel_options(cfg, ctx)
    if cfg.resume:
        check_resume(cfg, name)
        check_resume_inputs(cfg)
    else:
        check_model_source(cfg.model, cfg.trust_remote_code)
    return device, ctx


class Run:
    """One training run (see the module docstring). Use as `run = Run(cfg, "sft")` after validating
    the config and reading the data (with `preflight_run` before that), before any model loads:
    input that is refused then leaves no run directory behind."""

    def __init__(self, cfg, name: str):
        self.device, self.dist = preflight_run(cfg, name)  # before the run directory is touched
        self.cfg, self.name = cfg, name
        self.clock = RunClock()  # a resumed run's goes on from its checkpoint's time (`clock.resume`)
        self.out = Path(cfg.resume or cfg.out)
        self.lora = _lora_options(cfg)
        self.fsdp = bool(cfg.fsdp)
        self._dir = open_run_dir(self.out, cfg, name) if self.dist.is_main else None
        # the data files as this run reads them, kept in its checkpoints for `--resume` to compare
        self.inputs = input_fingerprints(cfg) if self.dist.is_main and cfg.save_every else {}
        self.dist.barrier()
        self.threads = setup_torch(cfg.threads, cfg.seed)
        self.precision = choose_precision(self.device, cfg.precision)
        self._plain: dict[int, torch.nn.Module] = {}
        self.log: MetricsLog | None = None
        self.trackers = Trackers.start(cfg.report_to, self.out, name, asdict(cfg),
                                       resume=bool(cfg.resume)) if self.dist.is_main else None

    # --- models ---------------------------------------------------------------------------
    def load_policy(self, tokenizer, keep_dropout: bool = True) -> torch.nn.Module:
        """`cfg.model` loaded and prepared; with QLoRA the frozen base is loaded in 4 bits."""
        qlora = self.lora if self.lora is not None and self.lora.qlora else None
        model = load_model(self.cfg.model, tokenizer, seed=self.cfg.seed, keep_dropout=keep_dropout, lora=qlora,
                           trust_remote_code=self.cfg.trust_remote_code)
        return self.prepare(model)

    def prepare(self, model: torch.nn.Module, train_in_full: tuple[str, ...] = ()) -> torch.nn.Module:
        """Move a freshly loaded model to the device; gradient checkpointing and LoRA as asked.
        `train_in_full`: modules trained whole beside the adapter (a reward model's score head)."""
        if not getattr(model, "is_loaded_in_4bit", False):  # a 4-bit base is placed on its GPU when loaded
            model = model.to(self.device)
        without_cpu_hub_kernels(model)
        if self.cfg.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        if self.lora is not None and not is_peft_model(model):
            opts = replace(self.lora, modules_to_save=[*self.lora.modules_to_save, *train_in_full])
            model = apply_lora(model, opts)
        if self.cfg.compile_blocks:
            compile_blocks(model)
        if self.fsdp:
            self._plain[id(model)] = plain_copy(model)
            shard_model(model, self.device, self.dist.world)
        return model

    def plain(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model to read outside the training step (sampling, evaluation, saving): itself, or
        under FSDP its unsharded copy as of the last `sync` (see lmpo/trainers/fsdp.py)."""
        return self._plain.get(id(model), model)

    def sync(self, model: torch.nn.Module) -> None:
        """After an update: refresh the unsharded copy (FSDP; every process calls it). A no-op otherwise."""
        if id(model) in self._plain:
            refresh(self._plain[id(model)], model)

    def frozen(self, model: torch.nn.Module) -> torch.nn.Module:
        """A model that is only read (a reference, a reward model): on the device, eval, no grad."""
        model = model.to(self.device)
        without_cpu_hub_kernels(model)
        if self.cfg.compile_blocks:
            compile_blocks(model)
        return model.eval().requires_grad_(False)

    def reference(self, policy: torch.nn.Module, load):
        """The KL reference: with LoRA, the policy itself read with its adapter disabled (no second
        copy); else a frozen copy made by `load()`."""
        if self.lora is not None:
            return AdapterDisabled(policy)
        return self.frozen(load())

    def trained(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module loss forwards run through: DistributedDataParallel across processes, the
        sharded model itself under FSDP."""
        if id(model) in self._plain:
            return model
        return wrap_data_parallel(model, self.dist, self.device)

    def autocast(self):
        return autocast(self.precision, self.device) if self.precision.autocast_dtype else nullcontext()

    def to_device(self, *tensors):
        moved = tuple(t.to(self.device) if isinstance(t, torch.Tensor) else t for t in tensors)
        return moved if len(moved) > 1 else moved[0]

    # --- resume, log, progress, checkpoints -------------------------------------------------
    def resume(self, model, optimizer, scheduler, generators: dict | None = None,
               extra_modules: dict | None = None) -> Resumed | None:
        """Load the newest complete checkpoint (with `--resume`), then open the metrics log."""
        resumed = resume_training(self.cfg, self.out, self.name, model, optimizer, scheduler, generators,
                                  extra_modules, rank=self.dist.rank)
        if resumed is not None:
            self.sync(model)  # FSDP: sample from the resumed weights
        self.clock.resume(resumed)
        self.say_budget(resumed)
        self.open_log(resumed.step if resumed else None)
        return resumed

    def say_budget(self, resumed: Resumed | None) -> None:
        """On resume: the time trained before, and what `--max_minutes` (which counts it) leaves."""
        if resumed is None or STATE_KEY not in resumed.state:
            return
        at_cap = "it ends at this checkpoint, where it stopped at its cap" if resumed.state.get(CAP_STOP) else None
        self.say(budget_line(self.clock.before, getattr(self.cfg, "max_minutes", 0), at_cap))

    def open_log(self, resumed_step: int | None, key: str = "step") -> None:
        if self.dist.is_main:
            self.log = MetricsLog(self.out / "metrics.jsonl", resume_from_step=resumed_step, key=key)
            if self.trackers is not None:  # the interrupted run's tracker run, from the checkpoint on
                self.trackers.resumed_from(resumed_step)

    def write(self, row: dict) -> None:
        if self.log is not None:
            self.log.write(row)
        if self.trackers is not None:
            self.trackers.write(row)

    def progress(self, total: int, initial: int = 0, label: str | None = None, unit: str = "step"):
        return StageProgress(label or self.name, total, initial, quiet=not self.dist.is_main, unit=unit)

    def elapsed(self) -> float:
        """Seconds since the run started (model loading included; a resumed run's counted from its
        checkpoint's), as `result.json`'s `seconds`."""
        return round(self.clock.seconds(), 3)

    def out_of_time(self, max_minutes: float) -> bool:
        """True once a wall-time cap of `max_minutes` (0 = none) has passed, the time before a resume
        included; rank 0's clock decides for all."""
        if not max_minutes:
            return False
        return bool(self.dist.broadcast(self.clock.seconds() >= 60 * max_minutes))

    def say(self, text: str) -> None:
        if self.dist.is_main:
            print(f"[{self.name}] {text}", flush=True)

    def describe(self, model: torch.nn.Module) -> str:
        """The run's one-line set-up: parameters (trainable), device, precision, processes, threads."""
        lora = f", LoRA r={self.lora.r}" if self.lora is not None else ""
        procs = f", {self.dist.world} processes" if self.dist.active else ""
        compiled = sum(hasattr(type(m), "_lmpo_eager_class") for m in model.modules())
        compiled = f", {compiled} blocks compiled (torch.compile)" if compiled else ""
        return (f"{parameter_counts(model).describe()}{lora}, {self.precision.description}{procs}{compiled}, "
                f"{self.threads} threads, run dir {self.out}")

    def checkpoint_due(self, step: int, last: int) -> bool:
        """A checkpoint after `step`: every `save_every` steps before the `last` one, and after
        any step before it once SIGTERM asked the run to stop (`lmpo.trainers.preemption`)."""
        every = self.cfg.save_every
        return bool(every) and step < last and (step % every == 0 or stop_requested())

    def checkpoint(self, step: int, model, tokenizer, optimizer, scheduler, generators: dict | None = None,
                   state: dict | None = None, extra_modules: dict | None = None, data_state: dict | None = None,
                   stopping: bool = False) -> None:
        """Every rank's generator states go into one resumable checkpoint, written by rank 0.
        `stopping`: the run ends after it anyway (its wall-time cap), so a SIGTERM does not stop it here."""
        generators = generators or {}
        rng = self.dist.gather({"torch": torch.get_rng_state(),
                                **{f"gen_{k}": g.get_state() for k, g in generators.items()}})
        sharded = id(model) in self._plain
        if sharded:  # every process writes its shards, then rank 0 completes the checkpoint
            if self.dist.is_main:
                sharded_checkpoint_dir(self.out, step)
            self.dist.barrier()
            save_sharded(model, optimizer, checkpoint_dir(self.out) / f".tmp-step_{step:06d}" / SHARDED)
            self.dist.barrier()
        if self.dist.is_main:
            save_checkpoint(self.out, step, unwrap(model), tokenizer, optimizer, scheduler, generators,
                            {**(state or {}), STATE_KEY: self.clock.seconds(), "config": asdict(self.cfg),
                             "inputs": self.inputs},
                            self.cfg.keep_checkpoints, extra_modules,
                            data_state, rank_rng=rng if self.dist.active else None, sharded=sharded)
        self.dist.barrier()
        if stop_requested() and not stopping:  # SIGTERM: this checkpoint is where the run stops
            self.close()
            raise Preempted(step, checkpoint_dir(self.out) / f"step_{step:06d}")

    # --- the end ------------------------------------------------------------------------------
    def finish(self, model, tokenizer, result: StageResult | None = None, extra_files=None, **fields) -> StageResult:
        """Save the final model (and the adapter with LoRA), write result.json, release the run."""
        self.sync(model)  # FSDP: the final weights, gathered
        model = self.plain(unwrap(model))
        model_dir = self.out / "model"  # with LoRA: the adapter (loads as base + adapter), and merged/ on request
        if self.dist.is_main:
            # written whole, then swapped in: no file of an earlier model (other shards, a full model
            # under an adapter) outlives it in model/
            self._write_model(model, tokenizer, model_dir)
            for write in extra_files or ():
                write(self.out)
        result = result or StageResult(name=self.name, seconds=0.0, model_dir="", run_dir=str(self.out))
        result.model_dir, result.run_dir = str(model_dir), str(self.out)
        result.seconds = self.clock.seconds()
        memory = {"peak_rss_mb": round(peak_rss_mb(), 1)}
        if self.device.type == "cuda":
            memory["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated(self.device) / 2**20, 1)
        if self.dist.is_main:
            result.write(self.out / "result.json", config=asdict(self.cfg), device=str(self.device),
                         precision=self.precision.name, processes=self.dist.world, **memory, **fields)
        self.close()
        return result

    def _write_model(self, model, tokenizer, model_dir: Path) -> None:
        """model/ written whole, then swapped in: no file of an earlier model (other shards, a full
        model under an adapter) outlives it. A failed write (a full disk) removes the partial copy
        and names what survives, as a failed checkpoint does."""
        fresh = staging_directory(model_dir)
        try:
            save_model(model, tokenizer, fresh, merged=self.lora is not None and self.cfg.lora_merge)
            replace_directory(fresh, model_dir)
        except Exception as err:  # noqa: BLE001 - only write failures are translated; the rest is re-raised
            if isinstance(err, RunDirError) or not is_write_failure(err):
                raise
            shutil.rmtree(fresh, ignore_errors=True)
            advice = (resume_advice(self.out, "newest") if self.cfg.save_every else
                      "no checkpoint was kept (--save_every 0), so the training is lost; give --save_every N "
                      "to keep checkpoints a rerun can --resume from")
            raise RunDirError(f"{fs_error(model_dir, err)}; {advice}") from err

    def close(self) -> None:
        if self.trackers is not None:
            self.trackers.close()
            self.trackers = None
        if self._dir is not None:
            self._dir.close()
            self._dir = None
        self.dist.close()


def budget_line(before_s: float, max_minutes: float, when_out: str | None = None) -> str:
    """What a resumed run is told of its clock: `--max_minutes` counts the time trained before;
    `when_out`: what it does with no time left, where that is not a step more (a stop at the cap
    its checkpoint records, a reference pass)."""
    spent = f"{before_s / 60:.2f} minutes trained before this resume"
    if not max_minutes:
        return f"{spent}; no wall-time cap (--max_minutes 0)"
    left = max_minutes - before_s / 60
    if left <= 0:
        return f"{spent}; --max_minutes {max_minutes:g} counts them, so no time is left: {when_out or 'it stops after its next step'}"
    return f"{spent}; --max_minutes {max_minutes:g} counts them and leaves {left:.2f} minutes"


def _check_parallel_options(cfg, ctx: Distributed) -> None:
    if cfg.fsdp and not ctx.active:
        raise ValueError("fsdp shards the model over processes: start the run with "
                         "`torchrun --nproc_per_node N -m lmpo train ...` (N >= 2)")
    if cfg.fsdp and getattr(cfg, "critic", "none") != "none":
        raise ValueError("fsdp with a critic is not supported yet; use DDP (no --fsdp) for PPO with a critic")
    if cfg.fsdp and cfg.compile_blocks:
        raise ValueError("compile_blocks with fsdp is not supported (FSDP2 wraps the same blocks); drop one of them")
    if cfg.compile_blocks:
        check_compiler(resolve_device(cfg.device))
    if cfg.fsdp and cfg.lora_r:
        raise ValueError("fsdp with LoRA is not supported: a LoRA adapter is small enough to replicate; "
                         "drop --fsdp (DDP) or --lora_r")
    if getattr(cfg, "micro_batch_tokens", 0) and ctx.active:
        raise ValueError("micro_batch_tokens packs each process's rows differently, so processes would run different "
                         "numbers of forward passes; with several processes use micro_batch_size")
    if cfg.logprob_chunk_tokens and ctx.active:
        raise ValueError("logprob_chunk_tokens calls the model's trunk and head directly, around the data-parallel "
                         "wrapper's forward; with several processes use micro_batch_size or gradient_checkpointing")


def _lora_options(cfg):
    if not cfg.lora_r:
        return None
    targets = cfg.lora_target_modules
    targets = targets if targets == "all-linear" else [t.strip() for t in targets.split(",") if t.strip()]
    return LoraOptions(r=cfg.lora_r, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout, target_modules=targets,
                       qlora=cfg.qlora)
