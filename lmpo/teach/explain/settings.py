"""What lmpo trains with: each method's preset over the trainers' defaults, and its citations.

The worked examples call `lmpo.algos` with exactly these options, so a page shows what
`lmpo train NAME` computes, not a textbook variant.
"""

from __future__ import annotations

from functools import lru_cache

RL_METHODS = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "ppo", "gspo", "cispo", "dapo")
PREFERENCE_METHODS = ("dpo", "ipo", "simpo")
METHODS = RL_METHODS + PREFERENCE_METHODS + ("reward_model", "kl")

# the RL defaults a page needs besides its preset (read from RLConfig, never restated here)
RL_DEFAULTS = ("std", "scale", "advantage_eps", "dual_clip", "max_new_tokens", "max_len_norm", "kl_estimator",
               "kl_placement", "beta", "gamma", "gae_lambda", "whiten_advantages", "whiten_eps", "whiten_std",
               "clip_eps_value", "vf_coef", "overlong_cache", "ratio_cap", "ratio_level")

# `{paper.KEY}`: lmpo's note on what the page takes from the paper, in the page's language (`Page.finish`)
PAPERS: dict[str, tuple[str, ...]] = {
    "grpo": ("Shao et al. 2024, DeepSeekMath, arXiv:2402.03300",),
    "dr_grpo": ("Liu et al. 2025, Understanding R1-Zero-Like Training, arXiv:2503.20783",),
    "rloo": ("Ahmadian et al. 2024, Back to Basics, arXiv:2402.14740",),
    "reinforce_pp": ("Hu 2025, REINFORCE++, arXiv:2501.03262",),
    "ppo": ("Schulman et al. 2017, Proximal Policy Optimization, arXiv:1707.06347",
            "Schulman et al. 2015, Generalized Advantage Estimation, arXiv:1506.02438",
            "Ouyang et al. 2022, InstructGPT, arXiv:2203.02155"),
    "gspo": ("Zheng et al. 2025, Group Sequence Policy Optimization, arXiv:2507.18071",),
    "cispo": ("MiniMax 2025, MiniMax-M1, arXiv:2506.13585",),
    "dapo": ("Yu et al. 2025, DAPO, arXiv:2503.14476",),
    "dpo": ("Rafailov et al. 2023, Direct Preference Optimization, arXiv:2305.18290",),
    "ipo": ("Azar et al. 2023, A General Theoretical Paradigm to Understand Learning from Human Preferences, "
            "arXiv:2310.12036",),
    "simpo": ("Meng, Xia & Chen 2024, SimPO, arXiv:2405.14734",),
    "reward_model": ("Ouyang et al. 2022, InstructGPT, arXiv:2203.02155",
                     "Eisenstein et al. 2023, Helping or Herding?{paper.centering}, arXiv:2312.09244"),
    "kl": ("Schulman 2020, Approximating KL Divergence, http://joschu.net/blog/kl-approx.html",
           "Shao et al. 2024, DeepSeekMath{paper.k3_in_loss}, arXiv:2402.03300",
           "Ziegler et al. 2019, Fine-Tuning LMs from Human Preferences{paper.kl_in_reward}, arXiv:1909.08593"),
}


@lru_cache(maxsize=None)
def rl_settings(method: str) -> dict:
    """The method's RL preset over `RLConfig`'s defaults for the options a page uses."""
    from lmpo.trainers.presets import RL_PRESETS
    from lmpo.trainers.rl_config import RLConfig

    return {**{name: getattr(RLConfig, name) for name in RL_DEFAULTS}, **RL_PRESETS[method].settings}


def preset_settings(method: str) -> dict:
    """Only what the preset itself sets (shown on the page as `lmpo train NAME`'s settings)."""
    from lmpo.trainers.presets import RL_PRESETS

    return dict(RL_PRESETS[method].settings)


@lru_cache(maxsize=None)
def preference_settings() -> dict:
    """`lmpo train dpo`'s defaults for the loss options."""
    from lmpo.trainers.preference import PreferenceConfig

    return {name: getattr(PreferenceConfig, name) for name in ("beta", "gamma", "label_smoothing")}


@lru_cache(maxsize=None)
def reward_model_settings() -> dict:
    """`lmpo train rm`'s defaults for the loss options."""
    from lmpo.trainers.reward_model import RewardModelConfig

    return {name: getattr(RewardModelConfig, name) for name in ("margin", "center_coef")}


def commands(method: str) -> tuple[str, ...]:
    """The commands that train with the method."""
    if method in RL_METHODS:
        return (f"lmpo train {method}", f"lmpo pipeline --rl {method}")
    if method == "dpo":
        return ("lmpo train dpo", "lmpo pipeline --rl dpo")
    if method in PREFERENCE_METHODS:
        return (f"lmpo train dpo --loss {method}", f"lmpo pipeline --rl dpo --dpo.loss {method}")
    if method == "reward_model":
        return ("lmpo train rm", "lmpo pipeline --rl ppo_rm")
    return ("lmpo train grpo", "lmpo train ppo",
            "lmpo train rl --beta B --kl_estimator k1|k2|k3|k3_ratio --kl_placement loss|reward")
