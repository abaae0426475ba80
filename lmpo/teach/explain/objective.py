"""The trainer's objective without a model: the registered functions called with a preset's options,
exactly as `lmpo.trainers.rl_batch` and `lmpo.trainers.rl_update` call them."""

from __future__ import annotations

import torch

from lmpo.algos import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
from lmpo.trainers.runtime import options_for


def call_text(registry_name: str, name: str, options: dict) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in options.items())
    return f"{registry_name}.get({name!r})(…{', ' + args if args else ''})"


def advantage_options(fn, s: dict) -> dict:
    """The estimator's options from the settings, as the trainer passes them."""
    return options_for(fn, {"std": s["std"], "scale": s["scale"], "eps": s["advantage_eps"]})


def loss_options(fn, s: dict) -> dict:
    """The policy loss's options from the settings, as `LossParts.from_config` builds them."""
    return options_for(fn, {"clip_eps_low": s["clip_eps_low"], "clip_eps_high": s["clip_eps_high"],
                            "dual_clip": s["dual_clip"] or None, "ratio_cap": s["ratio_cap"] or None,
                            "ratio_level": s["ratio_level"]})


def aggregation_options(fn, s: dict) -> dict:
    return options_for(fn, {"max_len": s["max_len_norm"] or s["max_new_tokens"]})


def policy_objective(s: dict, logprobs, old, advantages, mask, ref=None):
    """(token loss from the registered policy loss, its indicators, token loss with the KL term,
    the KL per token or None, the aggregated loss) — the trainer's `micro_step` without a model."""
    loss_fn = POLICY_LOSSES.get(s["loss"])
    token_loss, info = loss_fn(logprobs, old, advantages, mask, **loss_options(loss_fn, s))
    kl, total = None, token_loss
    if ref is not None and s["beta"] > 0 and s["kl_placement"] == "loss":
        kl_fn = KL_ESTIMATORS.get(s["kl_estimator"])
        kl = kl_fn(logprobs, ref, **options_for(kl_fn, {"old_logprobs": old}))
        total = token_loss + s["beta"] * torch.where(mask.bool(), kl, torch.zeros_like(kl))
    aggregate = AGGREGATIONS.get(s["aggregation"])
    return token_loss, info, total, kl, aggregate(total, mask, **aggregation_options(aggregate, s))
