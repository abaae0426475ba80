"""Start-up checks of a config: values that cannot work fail before any model loads, with
one message that lists every conflict."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config whose values cannot work together."""


def at_least(cfg, minimum: float, *names: str) -> list[str]:
    return [f"{name}={getattr(cfg, name)} must be >= {minimum}" for name in names if getattr(cfg, name) < minimum]


def optimizer_problems(cfg) -> list[str]:
    problems = at_least(cfg, 0, "warmup_steps", "weight_decay", "grad_clip")
    if not cfg.lr > 0:
        problems.append(f"lr={cfg.lr} must be > 0")
    if not 0 <= cfg.min_lr_ratio <= 1:
        problems.append(f"min_lr_ratio={cfg.min_lr_ratio} must be in [0, 1]")
    return problems


def checkpoint_problems(cfg) -> list[str]:
    problems = at_least(cfg, 0, "save_every")
    if cfg.save_every and cfg.keep_checkpoints < 1:
        problems.append(f"keep_checkpoints={cfg.keep_checkpoints} must be >= 1 when save_every > 0")
    return problems


def reward_problems(cfg) -> list[str]:
    """`rewards`, `reward_model`, `reward_timeout` and `reward_failure` of an RL or online DPO config."""
    from lmpo.envs import parse_reward_weights

    problems = []
    try:
        if "rm" in parse_reward_weights(cfg.rewards) and not cfg.reward_model:
            problems.append("reward 'rm' needs reward_model: the directory of a trained reward model")
    except ValueError as err:
        problems.append(str(err))
    if cfg.reward_timeout < 0:
        problems.append(f"reward_timeout={cfg.reward_timeout} must be >= 0 seconds")
    if cfg.reward_failure not in ("unscorable", "error"):
        problems.append(f"reward_failure={cfg.reward_failure!r} must be unscorable or error")
    return problems


def raise_if_any(kind: str, problems: list[str]) -> None:
    if problems:
        raise ConfigError(f"invalid {kind} config: " + "; ".join(problems))
