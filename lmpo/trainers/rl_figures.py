"""An RL step's figures for its metrics row: rewards, accuracy, lengths and the episodes' agent
figures over the whole batch, taken over every process under torchrun with one collective."""

from __future__ import annotations

import torch

from lmpo.trainers.agent_metrics import agent_figures
from lmpo.trainers.distributed import Distributed
from lmpo.trainers.rl_batch import Batch, Scored

# figures a process logs only where its own episodes had some: 0 where another process's did
ZERO_WHERE_ABSENT = ("reward_env", "unscorable_", "termination_")
# counts of the step's episodes or groups: a sum over processes, as one process counts them all
COUNTS = ("unscorable", "groups_sampled")


def step_figures(scored: Scored, batch: Batch, ctx: Distributed = Distributed(), limits=None) -> dict:
    """The step's figures over the whole batch (every process's share alike: means of equal shares),
    with the episodes' agent figures (`agent_figures`) where `limits` are given.

    Under torchrun, one gather of every process's figures (one collective, whatever figures a
    process has, so none can wait on a sum the others never enter): counts (unscorable episodes,
    by reason, and groups sampled) are sums; a termination's share and `reward_env` are 0 where a
    process had none; another figure
    some process lacks is the mean over those that have it; `value_mean` is over every process's
    trained tokens."""
    figures = _local_step_figures(scored, batch)
    if limits is not None:
        figures.update(agent_figures(scored.trajectories, limits))
    if not ctx.active:
        return figures
    figures.pop("value_mean", None)  # a process may have no trained token: said below over all of them
    values = 0.0 if batch.old_values is None else (batch.old_values * batch.loss_mask).sum().item()
    shares = ctx.gather((figures, values, batch.loss_mask.sum().item()))
    every = [share[0] for share in shares]
    merged = {}
    for key in dict.fromkeys(k for f in every for k in f):
        zero = key.startswith(ZERO_WHERE_ABSENT)
        have = [f.get(key, 0.0) for f in every] if zero else [f[key] for f in every if key in f]
        if key.endswith("_max"):
            merged[key] = max(have)
        else:
            merged[key] = sum(have) if key.startswith(COUNTS) else sum(have) / len(have)
    tokens = sum(share[2] for share in shares)
    if batch.old_values is not None and tokens:
        merged["value_mean"] = sum(share[1] for share in shares) / tokens
    return merged


def _local_step_figures(scored: Scored, batch: Batch) -> dict:
    rollout, n = scored.rollout, len(scored.grades)
    valid = scored.valid
    scorable = scored.rewards[valid]
    # a step (a process) with nothing scorable has no reward: a 0 would read as a collapse (collapse guard, doctor, plots)
    rewards = {} if not valid.any() else {
        "reward_mean": scorable.mean().item(), "reward_std": scorable.std().item() if len(scorable) > 1 else 0.0,
        **{f"reward_{k}": v[valid].mean().item() for k, v in scored.components.items()}}
    figures = {**rewards,
               "unscorable": int((~valid).sum()), **{f"unscorable_{k}": v for k, v in scored.unscorable.items()},
               "accuracy": sum(g.correct for g in scored.grades) / n,
               "format_accuracy": sum(g.well_formed for g in scored.grades) / n,
               "zero_var_frac": scored.groups_without_signal / max(scored.groups_sampled, 1),
               "groups_sampled": scored.groups_sampled,
               "completion_len_mean": rollout.lengths.float().mean().item(),
               "prompt_len_mean": sum(len(p) for p in rollout.prompt_ids) / max(len(rollout.prompt_ids), 1),
               "completion_len_max": int(rollout.lengths.max()),
               "truncated_frac": rollout.truncated.float().mean().item()}
    if batch.old_values is not None and batch.loss_mask.any():
        figures["value_mean"] = (batch.old_values * batch.loss_mask).sum().item() / batch.loss_mask.sum().item()
    return figures
