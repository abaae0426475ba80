"""What `lmpo compare` runs: each method's stage configuration at a matched budget.

A method is the last stage of `lmpo pipeline` (an RL preset, `dpo` or `online_dpo`, optionally
with a preference loss: `dpo:ipo`, `online_dpo:simpo`) with the pipeline's settings for the task
(`resolve_pipeline`, fixed budgets: no stopping rules), so that a compare run of grpo is the
pipeline's grpo stage at that budget.
Only the budget options change: RL `steps`, DPO `pairs`, online DPO `rounds` (and each trainer's
`max_minutes` under a time budget).

What counts as a sample: one completion the method trains on.
- RL: every completion sampled by the policy, prompts_per_step x group_size per step.
- online DPO: every completion sampled by the policy, prompts_per_round x samples_per_prompt per
  round (ties still cost their samples, though they give no pair).
- offline DPO: the two completions of each pair trained on, written ahead of time (by the task,
  not by the policy); a pair seen again in a later epoch is not counted again, as a PPO epoch
  over the same rollout is not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from lmpo.algos import PREFERENCE_LOSSES
from lmpo.trainers.pipeline import PipelineConfig, resolve_pipeline, validate_stages, with_options
from lmpo.teach.compare.texts import tx
from lmpo.teach.names import did_you_mean
from lmpo.trainers.presets import RL_PRESETS

DEFAULT_METHODS = "ppo,grpo,dpo,online_dpo"
PREFERENCE_STAGES = ("dpo", "online_dpo")


@dataclass
class CompareConfig:
    methods: str = DEFAULT_METHODS
    """Methods, comma-separated: RL presets (see `lmpo presets`), dpo, online_dpo; a preference loss after a colon (dpo:ipo, online_dpo:simpo)."""
    seeds: str = "0,1,2"
    """Seeds, comma-separated; each seed has its own SFT start and one run per method."""
    budget: Literal["samples", "time"] = "samples"
    """What is matched between methods: the number of samples (completions trained on) or the wall time."""
    samples: int = 0
    """Samples per run (0 = what the pipeline's grpo stage uses on the task: steps x prompts_per_step x group_size); under a time budget, the most a run may use."""
    minutes: float = 0.0
    """Wall time per run under --budget time (each trainer's max_minutes)."""
    task: str = "sort_digits"
    """Task for every run and its held-out evaluation (anything `lmpo pipeline --task` takes)."""
    out: str = "runs/compare"
    """Directory: one sub-directory per seed and method (SEED/METHOD), compare.json, compare.md, compare.html, plots."""
    threads: int = 2
    """Torch CPU threads of each run (0 = one per core); runs go one after another."""
    model: str = "tiny"
    """Model preset (or directory) the SFT starts are trained from."""
    start: str = ""
    """Start every run from this model directory instead of the task's SFT checkpoint of each seed."""
    device: str = "auto"
    """Where every run trains: auto, cpu, cuda or cuda:N."""
    precision: str = "auto"
    """Precision of every run: auto, fp32 or bf16."""
    lang: Literal["en", "zh"] = "en"
    """Language of the progress lines, table, recommendation, compare.md/compare.html and refusals (en or zh)."""

    def method_names(self) -> list[str]:
        return parse_list(self.methods, "methods", str, self.lang)

    def seed_list(self) -> list[int]:
        return parse_list(self.seeds, "seeds", int, self.lang)

    def validate(self) -> None:
        from lmpo.trainers.validation import literal_problems

        lang = self.lang
        problems = [_literal_problem(text, lang) for text in literal_problems(self)]
        for name in self.method_names():
            try:
                Method.parse(name, lang)
            except ValueError as err:
                problems.append(str(err))
        if len(set(self.method_names())) != len(self.method_names()):
            problems.append(tx("twice_method", lang, methods=self.methods))
        try:
            seeds = self.seed_list()
        except ValueError as err:
            problems.append(str(err))
        else:
            if len(set(seeds)) != len(seeds):  # a repeated seed reruns the same run and counts it twice
                problems.append(tx("twice_seed", lang, seeds=self.seeds))
        if self.samples < 0:
            problems.append(tx("samples_negative", lang, samples=self.samples))
        if self.budget == "time" and not self.minutes > 0:
            problems.append(tx("time_needs_minutes", lang))
        if self.budget == "samples" and self.minutes:
            problems.append(tx("minutes_without_time", lang, minutes=self.minutes))
        if self.threads < 0:
            problems.append(tx("threads", lang, threads=self.threads))
        problems += self._hardware_problems()
        if problems:
            raise ValueError(refused(problems, lang))

    def _hardware_problems(self) -> list[str]:
        """What every run's process would refuse as it starts, after the seed's SFT start was trained."""
        from lmpo.models.device import PRECISIONS, resolve_device

        problems = []
        if self.precision not in PRECISIONS:
            problems.append(tx("precision", self.lang, precision=self.precision, choices=", ".join(PRECISIONS)))
        try:
            resolve_device(self.device)
        except ValueError as err:
            problems.append(tx("device", self.lang, device=self.device, reason=err))
        return problems


def refused(problems: list[str], lang: str = "en") -> str:
    """`compare: A; B` in `lang`."""
    return tx("refused", lang, problems=tx("joiner", lang).join(problems))


def _literal_problem(text: str, lang: str) -> str:
    """`literal_problems`' English (`budget='x': expected one of samples, time`) in `lang`."""
    given, sep, choices = text.partition(": expected one of ")
    return tx("literal", lang, given=given, choices=choices) if sep else text


def _as_json_list(text: str) -> list[str]:
    """The items of a YAML list in --config (`methods: [grpo, dpo]`), which reaches a text option as
    JSON: split at its commas it was refused as "unknown method '["grpo"'"."""
    if not text.lstrip().startswith("["):
        return []
    try:
        items = json.loads(text)
    except ValueError:
        return []
    plain = isinstance(items, list) and all(isinstance(i, (str, int)) and not isinstance(i, bool) for i in items)
    return [str(i).strip() for i in items] if plain else []


def parse_list(text: str, name: str, kind: type, lang: str = "en") -> list:
    items = _as_json_list(text) or [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise ValueError(tx("list_empty", lang, name=name, text=text))
    try:
        return [kind(item) for item in items]
    except ValueError:
        raise ValueError(tx("list_kind", lang, name=name, kind=tx(f"kind.{kind.__name__}", lang),
                            text=text)) from None


@dataclass(frozen=True)
class Method:
    name: str
    """As the user wrote it: grpo, dpo, dpo:ipo..."""
    stage: str
    """The pipeline's last stage: an RL preset, dpo or online_dpo."""
    loss: str = ""
    """The preference loss of a dpo/online_dpo method ("" = the pipeline's)."""

    @classmethod
    def parse(cls, name: str, lang: str = "en") -> "Method":
        """The method `name` names; refused in `lang`."""
        stage, _, loss = name.partition(":")
        if stage not in (*RL_PRESETS, *PREFERENCE_STAGES):
            hint = did_you_mean(stage, (*RL_PRESETS, *PREFERENCE_STAGES), lang)
            raise ValueError(tx("unknown_method", lang, name=name, hint=hint, presets=", ".join(RL_PRESETS)))
        if loss and stage not in PREFERENCE_STAGES:
            raise ValueError(tx("loss_not_rl", lang, name=name))
        if loss and loss not in PREFERENCE_LOSSES:
            raise ValueError(tx("loss_unknown", lang, name=name, loss=loss, hint=did_you_mean(loss, PREFERENCE_LOSSES.names(), lang),
                                losses=", ".join(PREFERENCE_LOSSES.names())))
        return cls(name, stage, loss)

    @property
    def slug(self) -> str:
        """Its directory name."""
        return self.name.replace(":", "-")


@dataclass
class Plan:
    """One method at the budget: its pipeline configuration and what one unit of it costs."""

    method: Method
    pipeline: PipelineConfig
    unit: str
    """What the budget converts into: steps, pairs or rounds."""
    units: int
    samples_per_unit: int
    what_counts: str
    lang: str = "en"
    """The language of `what_counts` and `amount`."""

    @property
    def amount(self) -> str:
        """`1 step x 16`, `30 steps x 16`: the budget in units and the samples in each."""
        unit = tx(f"unit.{self.unit if self.units != 1 else self.unit[:-1]}", self.lang)
        return tx("amount", self.lang, units=self.units, unit=unit, per_unit=self.samples_per_unit)

    @property
    def stage(self):
        """The configuration of the stage that runs."""
        section = {"dpo": "dpo", "online_dpo": "online_dpo"}.get(self.method.stage, "rl_stage")
        return getattr(self.pipeline, section)

    @property
    def planned_samples(self) -> int:
        return self.units * self.samples_per_unit


def default_samples(task: str) -> int:
    """What the pipeline's grpo stage uses on `task`: steps x prompts_per_step x group_size."""
    rl = resolve_pipeline(PipelineConfig(task=task, rl="grpo", adaptive=False)).rl_stage
    return rl.steps * rl.prompts_per_step * rl.group_size


def budget_samples(cfg: CompareConfig) -> int:
    return cfg.samples or default_samples(cfg.task)


def plan_method(cfg: CompareConfig, method: Method, seed: int) -> Plan:
    """The pipeline configuration of `method` for `seed` with its budget options set."""
    base = resolve_pipeline(PipelineConfig(out=cfg.out, model=cfg.model, task=cfg.task, seed=seed,
                                           threads=cfg.threads, device=cfg.device, precision=cfg.precision,
                                           rl=method.stage, adaptive=False), explicit=())
    samples = budget_samples(cfg)
    minutes, lang = (cfg.minutes if cfg.budget == "time" else 0.0), cfg.lang
    if method.stage == "dpo":
        section, unit, per_unit = "dpo", "pairs", 2
        what = tx("what.dpo", lang)
    elif method.stage == "online_dpo":
        o = base.online_dpo
        section, unit, per_unit = "online_dpo", "rounds", o.prompts_per_round * o.samples_per_prompt
        what = tx("what.online_dpo", lang, prompts=o.prompts_per_round, samples=o.samples_per_prompt)
    else:
        r = base.rl_stage
        section, unit, per_unit = "rl_stage", "steps", r.prompts_per_step * r.group_size
        what = tx("what.rl", lang, prompts=r.prompts_per_step, group=r.group_size)
    if samples < per_unit:  # rounding up to one unit would spend more than the matched budget
        raise ValueError(tx("below_one_unit", lang, samples=samples, unit=tx(f"unit.{unit[:-1]}", lang),
                            method=method.name, per_unit=per_unit, what=what))
    units = samples // per_unit
    options = {f"{section}.{unit}": units, f"{section}.max_minutes": minutes}
    if method.loss:
        options[f"{section}.loss"] = method.loss
    pipeline = with_options(base, options)
    validate_stages(pipeline)
    return Plan(method, pipeline, unit, units, per_unit, what, lang)


def models_held(plan: Plan) -> list[str]:
    """The models a method keeps in memory while it trains, read from its configuration."""
    stage = plan.stage
    if plan.method.stage in PREFERENCE_STAGES:
        loss_fn = PREFERENCE_LOSSES.get(stage.loss)
        needs_reference = not getattr(loss_fn, "reference_free", False)
        if plan.method.stage == "dpo":  # reference log-probs computed once, before training; no model kept
            return ["policy"]
        return ["policy"] + (["reference"] if needs_reference and not stage.lora_r else [])
    held = ["policy"]
    if stage.beta > 0 and not stage.lora_r:
        held.append("reference")
    if stage.critic == "separate":
        held.append("critic")
    elif stage.critic == "head":
        held.append("critic (value head on the policy)")
    if "rm" in [part.split("=")[0].strip() for part in stage.rewards.split(",")]:
        held.append("reward model")
    return held


def held_words(plan: Plan) -> list[str]:
    """`models_held(plan)` in the plan's language, for the table."""
    return [tx(f"held.{model}", plan.lang) for model in models_held(plan)]


def reference_note(plan: Plan) -> str:
    """How a method keeps to its reference, in words for the table (in the plan's language)."""
    stage, lang = plan.stage, plan.lang
    if plan.method.stage == "dpo":
        free = getattr(PREFERENCE_LOSSES.get(stage.loss), "reference_free", False)
        return tx("ref.free" if free else "ref.precomputed", lang)
    if plan.method.stage == "online_dpo":
        return tx("ref.model" if "reference" in models_held(plan) else "ref.none", lang)
    return tx("ref.beta", lang, beta=stage.beta) if stage.beta > 0 else tx("ref.beta0", lang)
