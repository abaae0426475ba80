"""`lmpo train STAGE`: the stage's config from its preset, the task's suggestions, `--config` and
flags (or, with `--resume` alone, the interrupted run's own options), then its trainer; Ctrl-C
and SIGTERM end with the command that continues the run."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Callable

from lmpo.cli.config import ConfigError, build
from lmpo.cli.errors import check_resumable, run_command, saved_config, trainer_of
from lmpo.trainers.option_paths import absolute_paths, started_in
from lmpo.trainers.run_dir import remove_if_only_records


NOT_RL = ("cpt", "sft", "dpo", "online_dpo", "rm", "kto", "orpo")  # their options are kept in their checkpoints


def cmd_train(kind: str) -> Callable[[argparse.Namespace, dict], int]:
    def run(args: argparse.Namespace, flags: dict) -> int:
        command = flags.get("preset") or ("grpo" if kind == "rl" else kind)
        cls, fn, preset = _trainer(kind, flags)
        from lmpo.trainers.presets import task_settings

        given = build(cls, preset=preset, yaml_file=args.config, flags=flags)  # what the file and flags say
        task = getattr(given, "task", "")
        suggested = task_settings(task, kind if kind in NOT_RL else "rl") if isinstance(task, str) else {}
        if getattr(given, "data", "") and not getattr(given, "eval_prompts", ""):  # no held-out evaluation to shape
            suggested = {k: v for k, v in suggested.items() if k not in ("eval_problems", "eval_max_new_tokens")}
        preset = {**{k: v for k, v in suggested.items() if k in cls.__dataclass_fields__}, **preset}
        resumed_from = getattr(given, "resume", "")
        if resumed_from:
            if given.overwrite:
                raise ConfigError("--overwrite true starts a run afresh and --resume continues one: give one of them")
            check_resumable(resumed_from, trainer_of(command), command)
            if "out" in set_options(args.config, flags) and Path(given.out).resolve() != Path(resumed_from).resolve():
                raise ConfigError(f"--resume {resumed_from} continues the run in that directory, and --out "
                                  f"{given.out} names another: a resumed run writes where it started; give "
                                  f"--resume alone")
        if resumed_from:  # the interrupted run's own options, under what the file and flags say (checked against them)
            preset.update(_saved_options(resumed_from, required=kind not in NOT_RL))
        cfg = build(cls, preset=preset, yaml_file=args.config, flags=flags)
        if kind not in TRAINERS and not resumed_from:  # an RL preset's settings
            from lmpo.trainers.presets import preset_problems
            from lmpo.trainers.validation import raise_if_any

            raise_if_any("RL", preset_problems(cfg, command, set_options(args.config, flags)))
        from lmpo.trainers.distributed import launched_rank
        from lmpo.trainers.preemption import Preempted, Terminated, stop_at_next_step
        from lmpo.trainers.reference_pass import StoppedBeforeTraining

        one_process = int(os.environ.get("WORLD_SIZE", "1")) == 1
        fresh = not getattr(cfg, "resume", "") and not Path(cfg.out).exists()
        with run_command(command), stop_at_next_step(enabled=one_process and bool(getattr(cfg, "save_every", 0))):
            try:
                try:
                    result = fn(cfg)
                except Exception:  # not Ctrl-C: its hint resumes the run directory with its options
                    if fresh and launched_rank() == 0:
                        remove_if_only_records(cfg.out)
                    raise
            except StoppedBeforeTraining as stop:  # in the reference pass: its cap, or SIGTERM
                resume = f"{launcher()}lmpo train {command} --resume {cfg.resume or cfg.out}"
                print(f"lmpo: {stop}; {stop.going_on(resume)}", file=sys.stderr)
                return stop.code
            except Preempted as stop:
                print(f"lmpo: {stop}; {_continue_with(command, cfg.resume or cfg.out)}", file=sys.stderr)
                return 143  # 128 + SIGTERM, as if the signal had ended it
            except KeyboardInterrupt as stop:
                if launched_rank() == 0:
                    print(f"lmpo: {_resume_hint(command, Path(cfg.resume or cfg.out))}", file=sys.stderr)
                if isinstance(stop, Terminated):  # SIGTERM in a step that could not end (preemption.py)
                    return 143
                raise
            except RuntimeError as err:  # torch.OutOfMemoryError is one, as is the CPU allocator's failure
                advice = out_of_memory_advice(err, cfg, command)
                if advice is None:
                    raise
                print(f"lmpo: error: {advice}", file=sys.stderr)
                return 1

        if launched_rank() == 0:  # under torchrun, one summary line from rank 0
            acc = "n/a" if result.accuracy is None else f"{100 * result.accuracy:.1f}%"
            name = command if result.name == "rl" else result.name  # grpo, dapo, ...: the one RL trainer
            print(f"{name}: held-out accuracy {acc}, {result.seconds:.1f} s, model in {result.model_dir}")
        return 0

    return run


def set_options(yaml_file: str | None, flags: dict) -> set[str]:
    """The options the user set, as flags or in the YAML file."""
    from lmpo.cli.config import read_yaml

    return set(flags) | (set(read_yaml(yaml_file)[1]) if yaml_file else set())


def _resume_hint(command: str, out: Path) -> str:
    """What an interrupted `lmpo train` leaves, and how to go on from it."""
    newest = _newest_checkpoint(out)
    if newest is None:
        kept = " from the reference log-probs kept there" if (out / "reference_logps.pt").is_file() else ""
        return (f"{out} has no complete checkpoint yet (they come every --save_every steps); "
                f"`{launcher()}lmpo train {command} --resume {out}` starts it over with its options{kept}")
    return f"{out}: its newest complete checkpoint is {newest.name}; {_continue_with(command, out)}"


def _newest_checkpoint(out: Path) -> Path | None:
    from lmpo.trainers.checkpoint import complete_checkpoints

    done = complete_checkpoints(out)
    return done[-1] if done else None


def out_of_memory_advice(err: BaseException, cfg, command: str) -> str | None:
    """For an allocation that failed (CUDA's out-of-memory error, or the CPU allocator's), one line:
    what the allocator said, the options that make a step need less (first those `--resume`
    accepts: they change how a step is computed, not what it trains), and where the run can be
    continued from; else None."""
    text = " ".join(str(err).split())
    if "out of memory" not in text and "not enough memory" not in text:
        return None
    said = ". ".join(text.split(". ")[:3]).removesuffix(".")  # e.g. CUDA's: what, how much, how much was free
    same_run, new_run = [], []
    if not getattr(cfg, "gradient_checkpointing", True):
        same_run.append("--gradient_checkpointing true")
    if hasattr(cfg, "micro_batch_tokens"):  # RL: its log-probs chunk the head, its minibatches split
        if not cfg.logprob_chunk_tokens:
            same_run.append("--logprob_chunk_tokens 4096")
        same_run.append("--micro_batch_tokens N (or a smaller --micro_batch_size)")
    elif hasattr(cfg, "batch_size"):
        new_run.append(f"a smaller --batch_size (now {cfg.batch_size})")
    if hasattr(cfg, "lora_r") and not cfg.lora_r:
        new_run.append("--lora_r 16")
    if getattr(cfg, "precision", "") == "fp32":
        new_run.append("--precision bf16 where the device has it")
    out = Path(cfg.resume or cfg.out)
    line = f"out of memory ({said}); a step needs less with {', '.join(same_run) or 'a smaller model'}"
    if same_run:
        newest = _newest_checkpoint(out)
        since = f"its newest complete checkpoint: {newest.name}" if newest else "no complete checkpoint yet: it starts over"
        line += f", which `{launcher()}lmpo train {command} --resume {out}` accepts ({since})"
    return line + (f"; or, in a new run, with {', '.join(new_run)}" if new_run else "")


def _continue_with(command: str, out) -> str:
    return f"continue with `{launcher()}lmpo train {command} --resume {out}`"


def launcher() -> str:
    """How the run was launched, for a command that resumes it: a checkpoint of N processes
    resumes only with N (`torchrun --nproc_per_node N -m ` before `lmpo ...`)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return f"torchrun --nproc_per_node {world} -m " if world > 1 else ""


# `lmpo train KIND` → (module, config class, train function); every other KIND is an RL preset.
TRAINERS = {"cpt": ("supervised", "CPTConfig", "train_cpt"), "sft": ("supervised", "SFTConfig", "train_sft"),
            "rm": ("reward_model", "RewardModelConfig", "train_reward_model"),
            "dpo": ("preference", "PreferenceConfig", "train_preference"),
            "kto": ("kto", "KTOConfig", "train_kto"), "orpo": ("orpo", "ORPOConfig", "train_orpo"),
            "online_dpo": ("online_dpo", "OnlineDPOConfig", "train_online_dpo"),
            "rft": ("rft", "RFTConfig", "train_rft")}


def _trainer(kind: str, flags: dict) -> tuple[type, Callable, dict]:
    """(config class, train function, preset values) of `lmpo train KIND`."""
    if kind in TRAINERS:
        module, config, train = TRAINERS[kind]
        module = importlib.import_module(f"lmpo.trainers.{module}")
        return getattr(module, config), getattr(module, train), {}
    from lmpo.trainers.presets import rl_preset
    from lmpo.trainers.rl import train_rl
    from lmpo.trainers.rl_config import RLConfig

    name = flags.pop("preset", None) or (kind if kind != "rl" else "grpo")
    return RLConfig, train_rl, dict(rl_preset(name).settings)


def _saved_options(run_dir: str, required: bool) -> dict:
    """The options an interrupted run was started with: its `config.json` (RL) or the config
    stored in its newest complete checkpoint (the other trainers)."""
    from lmpo.trainers.checkpoint import MARKER, checkpoint_dir, checkpoint_state

    saved = Path(run_dir) / "config.json"
    if saved.is_file():
        options = json.loads(saved.read_text())
    else:
        done = sorted(p for p in checkpoint_dir(run_dir).glob("step_*") if (p / MARKER).exists())
        options = checkpoint_state(run_dir, done[-1]).get("config", {}) if done else {}
        options = options or saved_config(run_dir)  # killed before its first checkpoint
        if not options and required:
            if not Path(run_dir).is_dir():
                raise ConfigError(f"--resume {run_dir}: " + ("not a directory" if Path(run_dir).exists()
                                                            else "no such directory"))
            raise ConfigError(f"--resume {run_dir}: no config.json there; is it an lmpo RL run directory?")
    options.pop("resume", None)
    options.pop("overwrite", None)  # how that run started, not how it continues
    # its files, from wherever it resumes; a reward file's name only where it must change (its metric's name)
    start = started_in(run_dir) or os.getcwd()
    return absolute_paths(options, start, file_parts=os.path.realpath(start) != os.path.realpath(os.getcwd()))
