"""CPT → SFT → RL on one task, with held-out accuracy and wall time after each stage."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from lmpo.names import did_you_mean
from lmpo.models import check_model_source, load_tokenizer
from lmpo.rollout.engine_select import check_engine
from lmpo.trainers.distributed import launched_rank
from lmpo.trainers.kto import train_kto
from lmpo.trainers.online_dpo import train_online_dpo
from lmpo.trainers.orpo import train_orpo
from lmpo.trainers.pipeline_config import PipelineConfig, as_pipeline_flags, flags_of_stage  # noqa: F401 -- the CLI's
from lmpo.trainers.preference import train_preference
from lmpo.trainers.presets import RL_PRESETS, pipeline_preset, preset_problems
from lmpo.trainers.result import StageResult
from lmpo.trainers.reward_model import train_reward_model
from lmpo.trainers.rft import train_rft
from lmpo.trainers.pipeline_resume import check_fresh_start, continued_stage, finished_stage, resumed_pipeline
from lmpo.trainers.preemption import stop_at_next_step
from lmpo.trainers.preflight import load_prompt_files
from lmpo.trainers.rl import heldout_and_selection, train_rl
from lmpo.trainers.run_dir import RUN_RECORD, open_run_dir, remove_if_only_records
from lmpo.trainers.stopping import StopRule
from lmpo.trainers.supervised import heldout_problems, require_task_data, train_cpt, train_sft
from lmpo.trainers.validation import ConfigError, raise_if_any, unknown_name_problems


def options_given(cfg: PipelineConfig, explicit: Iterable[str] | None) -> set[str]:
    """The dotted options the caller set: `explicit`, or (the Python API) every option that
    differs from its default. A name in `explicit` that is no option is refused (ignored, a typo
    would leave the option it meant to the preset)."""
    if explicit is None:
        return set(changed_options(cfg, PipelineConfig()))
    if isinstance(explicit, str):
        raise ConfigError(f"explicit={explicit!r}: expected a collection of dotted option names "
                          f"(explicit={{{explicit!r}}}), not one string")
    given = set(explicit)
    raise_if_any("pipeline", unknown_name_problems(given, list(flat_options(cfg)), "explicit="))
    return given


def resolve_pipeline(cfg: PipelineConfig, explicit: Iterable[str] | None = None) -> PipelineConfig:
    """The configuration a pipeline runs with, for the Python API and the CLI alike: defaults <
    the stopping rules of `adaptive_budgets` < the task's suggested settings < the last stage's
    preset (`pipeline_preset`) < the options the caller set. `explicit` names those options as
    dotted keys (`rl_stage.beta`); without it, every option that differs from its default counts
    as set by the caller."""
    given = options_given(cfg, explicit)
    current = flat_options(cfg)
    layers = {**adaptive_budgets(cfg), **pipeline_preset(cfg.task, cfg.rl)}
    return with_options(cfg, {k: v for k, v in layers.items() if k in current and k not in given})


# Patience counts evaluations: CPT measures its held-out loss every 25 steps, RL its held-out
# accuracy every `eval_every` (50). The caps leave the embedded pipeline's time as it was: its
# step counts are the maxima, and the wall-time caps only bind on a machine many times slower.
ADAPTIVE_BUDGETS = {"cpt.stop_patience": 3, "cpt.stop_min_delta": 0.002, "cpt.max_minutes": 20.0,
                    "rl_stage.stop_patience": 3, "rl_stage.max_minutes": 20.0}


def adaptive_budgets(cfg: PipelineConfig) -> dict[str, Any]:
    """The stopping rules `adaptive` turns on, less those a stage cannot read: CPT on a user's
    `--cpt.data` has no held-out loss of the task's corpus, RL without held-out problems no accuracy."""
    if not cfg.adaptive:
        return {}
    rules = dict(ADAPTIVE_BUDGETS)
    if cfg.cpt.data:
        rules = {k: v for k, v in rules.items() if not k.startswith("cpt.")}
    if not cfg.rl_stage.eval_problems:
        rules = {k: v for k, v in rules.items() if not k.startswith("rl_stage.")}
    return rules


def flat_options(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted option name → value, nested stage sections included."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            out.update(flat_options(value, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = value
    return out


def changed_options(cfg: Any, default: Any) -> list[str]:
    base = flat_options(default)
    return [k for k, v in flat_options(cfg).items() if base.get(k) != v]


def with_options(cfg: Any, values: dict[str, Any]) -> Any:
    """A copy of `cfg` with dotted options replaced."""
    top = {k: v for k, v in values.items() if "." not in k}
    for section in {k.partition(".")[0] for k in values if "." in k}:
        inner = {k.partition(".")[2]: v for k, v in values.items() if k.startswith(section + ".")}
        top[section] = with_options(getattr(cfg, section), inner)
    return replace(cfg, **top)


def run_pipeline(cfg: PipelineConfig, explicit: Iterable[str] | None = None,
                 after_stage: Callable[[StageResult], None] | None = None,
                 preemptible: bool = False) -> list[StageResult]:
    """Run CPT → SFT → the last stage with `resolve_pipeline(cfg, explicit)`; `after_stage` is
    called with each stage's result (the CLI prints the doctor's findings there). `preemptible`
    (the CLI, one process): SIGTERM stops a stage that checkpoints after its current step, with a
    checkpoint there (`Preempted`), as `lmpo train` does."""
    given = options_given(cfg, explicit)
    cfg = resolve_pipeline(cfg, explicit)
    check_fresh_start(cfg)  # an interrupted pipeline in --out: refused without --overwrite, as `lmpo train` does
    if cfg.resume:
        cfg = resumed_pipeline(cfg, given)
    out = Path(cfg.out)
    main = launched_rank() == 0  # under torchrun each stage runs on every process; rank 0 writes and prints
    if cfg.rl not in LAST_STAGES:
        raise ValueError(f"unknown last stage --rl {cfg.rl!r}{did_you_mean(cfg.rl, LAST_STAGES)}; choose one of: "
                         f"{', '.join(LAST_STAGES)}")
    validate_stages(cfg, given)  # every stage's arithmetic, before anything is written
    created = not out.exists()
    if main:
        open_run_dir(out, cfg, "pipeline")  # on --resume: refuses options other than the pipeline's
        if not cfg.resume:
            (out / "config.json").write_text(json.dumps(asdict(cfg), indent=2))
    try:
        return _run_stages(cfg, out, main, after_stage, preemptible)
    except BaseException:
        if main and created:
            remove_if_only_records(out)
        raise


def _run_stages(cfg: PipelineConfig, out: Path, main: bool,
                after_stage: Callable[[StageResult], None] | None, preemptible: bool) -> list[StageResult]:
    # run again, the pipeline trains every stage afresh over what an interrupted run of it left in
    # the stages' directories; with --resume it goes on from there (`pipeline_resume`)
    shared = {"task": cfg.task, "seed": cfg.seed, "threads": cfg.threads, "device": cfg.device,
              "precision": cfg.precision, "overwrite": True}
    cpt = replace(cfg.cpt, model=cfg.model, out=str(out / "cpt"), **shared)
    def report(result: StageResult) -> None:
        if main:
            _report_stage(result)
            if after_stage is not None:
                after_stage(result)

    continuing = [bool(cfg.resume)]  # every stage so far was kept: the next may be kept or resumed

    def stage(train, stage_cfg) -> StageResult:
        with flags_of_stage(Path(stage_cfg.out).name):
            return run_one(train, stage_cfg)

    def run_one(train, stage_cfg) -> StageResult:
        if continuing[0]:
            kept = finished_stage(stage_cfg)
            if kept is not None:
                if main:
                    print(f"[pipeline] {Path(stage_cfg.out).name}: finished earlier with these options; kept")
                return kept
            continuing[0] = False
            stage_cfg = continued_stage(stage_cfg)
        with stop_at_next_step(enabled=preemptible and bool(stage_cfg.save_every)):
            return train(stage_cfg)

    results = [stage(train_cpt, cpt)]
    report(results[-1])
    sft = replace(cfg.sft, model=results[-1].model_dir, out=str(out / "sft"), **shared)
    results.append(stage(train_sft, sft))
    report(results[-1])
    def earlier(result: StageResult) -> None:  # the reward model of ppo_rm: a stage of its own
        results.append(result)
        report(result)

    result = last_stage(cfg, results[-1].model_dir, out, shared, stage, earlier)
    result.name = cfg.rl
    results.append(result)
    report(result)
    if main:
        write_summary(out, results)
        _remove_earlier_stages(out, {"cpt", "sft", cfg.rl, *((REWARD_MODEL_STAGE,) if cfg.rl == "ppo_rm" else ())})
        _report_kinds(results)
    return results


def _remove_earlier_stages(out: Path, ran: set[str]) -> None:
    """An earlier pipeline's stage directories that this one did not write (another --rl): left,
    `lmpo doctor` and `lmpo report` read them as this pipeline's. Removed at the end, since one
    of them may have held an input of this run (a reward model, a start model)."""
    for stage in sorted({REWARD_MODEL_STAGE, *LAST_STAGES} - ran):
        path = out / stage
        if path.is_dir() and not path.is_symlink() and (path / RUN_RECORD).is_file():
            shutil.rmtree(path, ignore_errors=True)
            print(f"[pipeline] {path}: removed, a stage of the earlier pipeline in {out}")


REWARD_MODEL_STAGE = "rm"
"""The stage `--rl ppo_rm` trains its reward model in: its accuracy is held-out pairwise accuracy
(the chosen reply scored above the rejected one), not answer accuracy; summary.json gives it as
`pairwise_accuracy`, with `kind` "reward_model" (the others' kind is "policy")."""


OFFLINE_STAGES = {"dpo": train_preference, "kto": train_kto, "orpo": train_orpo}  # the section is the name
LAST_STAGES = (*RL_PRESETS, *OFFLINE_STAGES, "online_dpo", "ppo_rm", "rft")


def sections_run(rl: str) -> tuple[str, ...]:
    """The option sections of the stages a pipeline with `--rl rl` runs (the others' options would
    be ignored)."""
    last = {"rft": ("rft",), "online_dpo": ("online_dpo",), "ppo_rm": ("rm", "rl_stage")}.get(
        rl, (rl,) if rl in OFFLINE_STAGES else ("rl_stage",))
    return ("cpt", "sft", *last)


def _check_templates(cfg: PipelineConfig) -> None:
    """Each stage's --<section>.chat_template file and template variables, read and rendered with
    the starting model's tokenizer now, not when that stage starts after the ones before it."""
    for section in sections_run(cfg.rl):
        stage = getattr(cfg, section)
        if stage.chat_template or stage.chat_template_kwargs:
            with flags_of_stage(section):
                load_tokenizer(cfg.model, stage.trust_remote_code, stage.chat_template, stage.chat_template_kwargs)


def validate_stages(cfg: PipelineConfig, given: Iterable[str] = ()) -> None:
    """Every stage's options, before anything runs; `given`: the dotted options the caller set (a
    conflict that the last stage's preset made, and the caller did not, says so)."""
    cfg.cpt.validate()
    cfg.sft.validate()
    from lmpo.envs import make_task

    task = make_task(cfg.task)  # a bad task option
    check_model_source(cfg.model, cfg.cpt.trust_remote_code)
    _check_templates(cfg)
    for section, method, what in (("cpt", "cpt_corpus", "CPT corpus"), ("sft", "sft_demonstrations", "SFT demonstrations")):
        stage = replace(getattr(cfg, section), model=cfg.model, task=cfg.task)
        if not stage.data:
            require_task_data(task, method, what, f"--{section}.data")
        tokenizer = load_tokenizer(cfg.model, stage.trust_remote_code) if stage.eval_prompts else None
        try:
            heldout_problems(stage, task, tokenizer)  # what the stage evaluates on exists
        except ValueError as err:
            raise ValueError(f"{err} (in a pipeline, the option is --{section}.<name>)") from None
    if cfg.rl in (*OFFLINE_STAGES, "online_dpo", "ppo_rm") and getattr(task, "max_turns", 1) > 1:
        raise ValueError(f"--rl {cfg.rl} pairs or scores whole single-turn completions; task {cfg.task!r} is "
                         f"multi-turn: use an RL preset ({', '.join(RL_PRESETS)})")
    if cfg.rl in OFFLINE_STAGES:
        getattr(cfg, cfg.rl).validate()
    elif cfg.rl == "online_dpo":
        cfg.online_dpo.validate()
    elif cfg.rl == "rft":
        cfg.rft.validate()
    else:
        if cfg.rl == "ppo_rm":
            cfg.rm.validate()
            replace(cfg.rl_stage, rewards="rm=1.0", reward_model="(trained by the pipeline)").validate()
        else:
            own = {key.partition(".")[2] for key in given if key.startswith("rl_stage.")}
            raise_if_any("RL", preset_problems(cfg.rl_stage, cfg.rl, own, flag_prefix="rl_stage."))
    _check_sampling_stage(cfg, task)


def _check_sampling_stage(cfg: PipelineConfig, task) -> None:
    """The last stage's engine, prompt files and held-out set, checked now rather than after CPT
    and SFT have run (the files read with the pipeline's starting tokenizer, which the stages keep)."""
    section = {"rft": "rft", "online_dpo": "online_dpo"}.get(cfg.rl, None if cfg.rl in OFFLINE_STAGES else "rl_stage")
    if section is None:
        return
    stage = replace(getattr(cfg, section), model=cfg.model, task=cfg.task)
    if getattr(stage, "engine", None):
        check_engine(stage.engine)
    loaded = load_prompt_files(stage, "pipeline")
    try:
        if not stage.prompts:
            task.train_problems(1, cfg.seed)  # a task without problems of its own (exact_match) says so
        if stage.eval_problems and section == "rl_stage":
            heldout_and_selection(stage, task, loaded, StopRule.from_options(stage, higher_is_better=True).active)
        elif stage.eval_problems and not stage.eval_prompts:
            task.heldout_problems(1)
    except ValueError as err:
        raise ValueError(f"{err} (in a pipeline, the option is --{section}.<name>)") from None


def last_stage(cfg: PipelineConfig, sft_model: str, out: Path, shared: dict,
               stage: Callable[[Callable, Any], StageResult] = lambda train, stage_cfg: train(stage_cfg),
               earlier: Callable[[StageResult], None] | None = None) -> StageResult:
    """The stage after SFT: an RL preset, offline DPO, KTO or ORPO, online DPO, rejection-sampling fine-tuning,
    or PPO on a learned reward. `stage(train, cfg)` runs each trainer (the pipeline's arms SIGTERM);
    `earlier` gets the result of a stage the last one needs (ppo_rm's reward model, `REWARD_MODEL_STAGE`),
    trained or kept, which is otherwise said in one line."""
    stage_out = str(out / cfg.rl)
    if cfg.rl in OFFLINE_STAGES:
        return stage(OFFLINE_STAGES[cfg.rl], replace(getattr(cfg, cfg.rl), model=sft_model, out=stage_out, **shared))
    if cfg.rl == "online_dpo":
        return stage(train_online_dpo, replace(cfg.online_dpo, model=sft_model, out=stage_out, **shared))
    if cfg.rl == "rft":
        return stage(train_rft, replace(cfg.rft, model=sft_model, out=stage_out, resume="", **shared))
    extra = {}
    if cfg.rl == "ppo_rm":
        rm = stage(train_reward_model, replace(cfg.rm, model=sft_model, out=str(out / REWARD_MODEL_STAGE), **shared))
        rm.name = REWARD_MODEL_STAGE
        if earlier is not None:
            earlier(rm)
        else:
            _report_stage(rm)
        extra = {"rewards": "rm=1.0", "reward_model": rm.model_dir}
    return stage(train_rl, replace(cfg.rl_stage, model=sft_model, out=stage_out, resume="", **extra, **shared))


def _report_stage(result: StageResult) -> None:
    if result.name == REWARD_MODEL_STAGE:
        print(f"[pipeline] {result.name} (reward model): held-out pairwise accuracy "
              f"{100 * (result.accuracy or 0):.1f}%, {result.seconds:.1f} s")
        return
    agent = f", tool-call rate {100 * result.tool_call_rate:.1f}%" if result.tool_call_rate else ""
    if result.terminations and set(result.terminations) != {"answered"}:
        ordered = sorted(result.terminations.items(), key=lambda kv: -kv[1])
        agent += ", endings: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in ordered)
    if result.breakdown:
        b = result.breakdown
        agent += (f", hand-offs {100 * b['handoff_rate']:.1f}% (correct {100 * b['handoff_correct']:.1f}%, "
                  f"unnecessary {100 * b['handoff_unnecessary']:.1f}%)")
        agent += "".join(f", {k[:-5].replace('_', ' ')}/episode {v:.3f}" for k, v in b.items() if k.endswith("_mean"))
    print(f"[pipeline] {result.name}: held-out accuracy {100 * (result.accuracy or 0):.1f}%, "
          f"format {100 * (result.format_accuracy or 0):.1f}%{agent}, {result.seconds:.1f} s")


def _report_kinds(results: list[StageResult]) -> None:
    """Held-out success per problem kind and stage, for tasks whose problems have kinds."""
    kinds = sorted({k for r in results for k in (r.breakdown or {}).get("by_kind", {})})
    if not kinds:
        return
    results = [r for r in results if r.name != REWARD_MODEL_STAGE]
    print("[pipeline] held-out success per kind: " + " | ".join(r.name for r in results))
    for kind in kinds:
        cells = []
        for r in results:
            f = (r.breakdown or {}).get("by_kind", {}).get(kind)
            cells.append("n/a" if f is None else f"{100 * f['accuracy']:.1f}%")
        print(f"[pipeline]   {kind:<12} " + " | ".join(cells))


def write_summary(out: Path, results: list[StageResult]) -> Path:
    """summary.json: every stage in the order it ran, ppo_rm's reward model included, whose
    held-out pairwise accuracy is its `pairwise_accuracy` (its `accuracy`, answer accuracy, null)."""
    stages = [{"name": r.name, **_accuracies(r), "format_accuracy": r.format_accuracy,
               "seconds": round(r.seconds, 2), "run_dir": Path(r.run_dir).name, "model_dir": r.model_dir,
               **({"tool_call_rate": r.tool_call_rate, "terminations": r.terminations} if r.terminations else {}),
               **({"breakdown": r.breakdown} if r.breakdown else {})}
              for r in results]
    path = out / "summary.json"
    path.write_text(json.dumps({"stages": stages, "total_seconds": round(sum(r.seconds for r in results), 2),
                                "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=2))
    return path


def _accuracies(result: StageResult) -> dict[str, Any]:
    if result.name == REWARD_MODEL_STAGE:
        return {"kind": "reward_model", "accuracy": None, "pairwise_accuracy": result.accuracy}
    return {"kind": "policy", "accuracy": result.accuracy}
