"""Published RL methods as presets of the one RL loop: each names its parts and its source."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    source: str
    settings: dict


RL_PRESETS: dict[str, Preset] = {
    "grpo": Preset(
        "DeepSeekMath, Shao et al. 2024, arXiv:2402.03300",
        {"advantage": "grpo", "std": "sample", "scale": "group", "loss": "ppo_clip", "clip_eps_low": 0.2,
         "clip_eps_high": 0.2, "aggregation": "seq_mean_token_mean", "beta": 0.04, "kl_estimator": "k3"},
    ),
    "dr_grpo": Preset(
        "Liu et al. 2025, Understanding R1-Zero-Like Training, arXiv:2503.20783",
        {"advantage": "dr_grpo", "loss": "ppo_clip", "clip_eps_low": 0.2, "clip_eps_high": 0.2,
         "aggregation": "seq_mean_token_sum_norm", "beta": 0.0},
    ),
    "rloo": Preset(
        "Ahmadian et al. 2024, Back to Basics, arXiv:2402.14740",
        {"advantage": "rloo", "loss": "ppo_clip", "aggregation": "seq_mean_token_mean", "beta": 0.0},
    ),
}


def rl_preset(name: str) -> Preset:
    if name not in RL_PRESETS:
        raise ValueError(f"unknown RL preset {name!r}; choose one of: {', '.join(RL_PRESETS)}")
    return RL_PRESETS[name]
