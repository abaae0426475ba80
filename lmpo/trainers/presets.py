"""Published RL methods as presets of the one RL loop: each names its parts and its source.

A preset only sets parts of `RLConfig`; the budget (steps, prompts per step, group size, lr)
stays common so that methods compare on the same footing. Any part can be overridden.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmpo.names import did_you_mean


@dataclass(frozen=True)
class Preset:
    source: str
    settings: dict


RL_PRESETS: dict[str, Preset] = {
    "grpo": Preset(
        "DeepSeekMath, Shao et al. 2024, arXiv:2402.03300",
        {"advantage": "grpo", "std": "sample", "scale": "group", "loss": "ppo_clip", "clip_eps_low": 0.2,
         "clip_eps_high": 0.2, "aggregation": "seq_mean_token_mean", "beta": 0.04, "kl_estimator": "k3",
         "kl_placement": "loss"},
    ),
    "dr_grpo": Preset(
        "Liu et al. 2025, Understanding R1-Zero-Like Training, arXiv:2503.20783",
        {"advantage": "dr_grpo", "loss": "ppo_clip", "clip_eps_low": 0.2, "clip_eps_high": 0.2,
         "aggregation": "seq_mean_token_sum_norm", "beta": 0.0},
    ),
    "dapo": Preset(
        "DAPO, Yu et al. 2025, arXiv:2503.14476",
        {"advantage": "grpo", "std": "sample", "scale": "group", "loss": "ppo_clip", "clip_eps_low": 0.2,
         "clip_eps_high": 0.28, "aggregation": "token_mean", "beta": 0.0, "dynamic_sampling": True,
         "overlong": "penalty", "overlong_cache": 4},
    ),
    "gspo": Preset(
        "GSPO, Zheng et al. 2025, arXiv:2507.18071",
        {"advantage": "grpo", "std": "sample", "scale": "group", "loss": "gspo", "clip_eps_low": 3e-4,
         "clip_eps_high": 4e-4, "aggregation": "seq_mean_token_mean", "beta": 0.0},
    ),
    "rloo": Preset(
        "Ahmadian et al. 2024, Back to Basics, arXiv:2402.14740",
        {"advantage": "rloo", "loss": "ppo_clip", "clip_eps_low": 0.2, "clip_eps_high": 0.2,
         "aggregation": "seq_mean_token_mean", "beta": 0.0},
    ),
    "reinforce_pp": Preset(
        "REINFORCE++, Hu 2025, arXiv:2501.03262",
        {"advantage": "reinforce_pp", "gamma": 1.0, "loss": "ppo_clip", "clip_eps_low": 0.2, "clip_eps_high": 0.2,
         "aggregation": "token_mean", "beta": 0.01, "kl_estimator": "k1", "kl_placement": "reward"},
    ),
    "cispo": Preset(
        "MiniMax-M1, 2025, arXiv:2506.13585 (no lower bound on the IS weight; upper bound ours: 0.28)",
        {"advantage": "grpo", "std": "sample", "scale": "group", "loss": "cispo", "clip_eps_low": 1.0,
         "clip_eps_high": 0.28, "aggregation": "token_mean", "beta": 0.0},
    ),
    "ppo": Preset(
        "Schulman et al. 2017, arXiv:1707.06347; RLHF form: Ouyang et al. 2022, arXiv:2203.02155",
        {"advantage": "gae", "critic": "separate", "gamma": 1.0, "gae_lambda": 0.95, "whiten_advantages": True,
         "loss": "ppo_clip", "clip_eps_low": 0.2, "clip_eps_high": 0.2, "clip_eps_value": 0.2, "vf_coef": 0.5,
         "aggregation": "token_mean", "beta": 0.05, "kl_estimator": "k1", "kl_placement": "reward",
         "num_iterations": 2, "num_minibatches": 2},
    ),
}


def rl_preset(name: str) -> Preset:
    if name not in RL_PRESETS:
        raise ValueError(f"unknown RL preset {name!r}{did_you_mean(name, RL_PRESETS)}; choose one of: "
                         f"{', '.join(RL_PRESETS)}")
    return RL_PRESETS[name]


def preset_problems(cfg, name: str, given: set[str], flag_prefix: str = "") -> list[str]:
    """`cfg.problems()`, each that a setting of the RL preset `name` causes (and the user did not
    give) saying so, with the option that undoes it: `lmpo train ppo --advantage grpo` is refused
    because the preset sets critic=separate, not because the user did. A setting causes a problem
    when the problem goes away with that option at its default, which the hint then suggests
    (`flag_prefix`: the pipeline's section, `rl_stage.`)."""
    from dataclasses import replace

    problems = cfg.problems()
    if not problems:
        return []
    defaults = type(cfg)()
    causes: dict[str, list[str]] = {}
    for key, value in rl_preset(name).settings.items():
        default = getattr(defaults, key)
        if key in given or getattr(cfg, key) != value or value == default:
            continue
        remaining = set(replace(cfg, **{key: default}).problems())
        for problem in problems:
            if problem not in remaining:
                causes.setdefault(problem, []).append(key)
    return [problem + (f" (the {name} preset sets {', '.join(f'{k}={_flag_value(getattr(cfg, k))}' for k in keys)}; "
                       f"pass {' '.join(f'--{flag_prefix}{k} {_flag_value(getattr(defaults, k))}' for k in keys)})"
                       if (keys := causes.get(problem)) else "") for problem in problems]


def _flag_value(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def task_settings(task_spec: str, stage: str) -> dict:
    """Options a task suggests for one stage ("cpt", "sft", "rl", ...): its episode token budget
    for sampling and evaluation, and any `pipeline_settings` it names for that stage. They sit
    below the method's preset and the user's own options."""
    from lmpo.envs import make_task

    try:
        task = make_task(task_spec)
    except ValueError:
        return {}  # the stage reports the bad task itself
    settings: dict = {}
    budget = getattr(task, "max_tokens", 0)
    if budget:
        if stage != "online_dpo":  # its evaluation samples --max_new_tokens, as its rounds do
            settings["eval_max_new_tokens"] = budget
        if stage in ("rl", "online_dpo"):
            settings["max_new_tokens"] = budget
    settings.update(getattr(task, "pipeline_settings", {}).get(stage, {}))
    return settings


# PPO on a learned reward: the `ppo` preset, plus TRL's penalty on completions that never ended;
# the reward model only ever saw finished answers, and without it PPO learns to ramble
# (measured: a run without it fell below its SFT start by hacking unterminated strings).
PPO_RM_SETTINGS = {"missing_eos_penalty": 10.0}


def pipeline_preset(task_spec: str, last_stage: str) -> dict:
    """What `lmpo pipeline` (and `run_pipeline`) put under the user's own options, as dotted
    keys: the task's suggested settings for every stage, then the last stage's RL preset
    (`ppo` plus `PPO_RM_SETTINGS` for `ppo_rm`; none for dpo, online_dpo, kto and orpo)."""
    name = "ppo" if last_stage == "ppo_rm" else last_stage
    settings = dict(rl_preset(name).settings) if name in RL_PRESETS else {}
    if last_stage == "ppo_rm":
        settings.update(PPO_RM_SETTINGS)
    return {**pipeline_task_settings(task_spec), **{f"rl_stage.{k}": v for k, v in settings.items()}}


def pipeline_task_settings(task_spec: str) -> dict:
    """`task_settings` for every stage of `lmpo pipeline`, as dotted keys."""
    stages = {"cpt": "cpt", "sft": "sft", "rl_stage": "rl", "online_dpo": "online_dpo", "dpo": "dpo", "kto": "kto",
              "orpo": "orpo", "rft": "rl"}
    return {f"{section}.{k}": v for section, stage in stages.items() for k, v in task_settings(task_spec, stage).items()}
