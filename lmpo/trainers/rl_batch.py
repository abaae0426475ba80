"""The data of one RL step: sampling and scoring (with DAPO's dynamic sampling), the batch
laid out for the loss, and the advantages."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from lmpo.algos import (ADVANTAGES, TOKEN_ADVANTAGES, advantages_of_valid, groups_with_signal, masked_whiten,
                        overlong_penalty, token_rewards, truncation_mask, whiten_sequences)
from lmpo.envs import Grade, Problem
from lmpo.rollout import Rollout, concat_rollouts, left_pad
from lmpo.rollout.agent_loop import EpisodeRunner
from lmpo.rollout.evaluation import grade_all
from lmpo.rollout.reward_runner import RewardRunner
from lmpo.rollout.trajectory import Trajectory, to_rollout
from lmpo.trainers.distributed import Distributed
from lmpo.trainers.termination import TerminationPolicy
from lmpo.trainers.rl_config import RLConfig
from lmpo.trainers.reward_watch import note_episodes
from lmpo.trainers.runtime import options_for


@dataclass
class Scored:
    """Sampled completions with their rewards; `group_ids` ties each to its prompt; `valid`
    is False for an unscorable completion (a reward function failed on it), `unscorable`
    counts them per reward function."""

    rollout: Rollout
    problems: list[Problem]
    group_ids: torch.Tensor
    rewards: torch.Tensor
    components: dict[str, torch.Tensor]
    grades: list[Grade]
    groups_sampled: int
    groups_without_signal: int
    valid: torch.Tensor | None = None
    unscorable: dict[str, int] = field(default_factory=dict)
    trajectories: list[Trajectory] = field(default_factory=list)
    env_rewards: torch.Tensor | None = None
    """The environment's own rewards per trajectory (summed over turns; part of `rewards`)."""
    trained: torch.Tensor | None = None
    """False where the termination policy keeps a trajectory's tokens out of the loss."""

    def __post_init__(self):
        if self.valid is None:
            self.valid = torch.ones(len(self.rewards), dtype=torch.bool)
        if self.env_rewards is None:
            self.env_rewards = torch.zeros(len(self.rewards))
        if self.trained is None:
            self.trained = torch.ones(len(self.rewards), dtype=torch.bool)


@dataclass
class Batch:
    """One rollout batch, laid out for the loss: prompts left-padded, completions right-padded."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    turn_rewards: torch.Tensor | None = None
    """The environment's per-turn rewards on the last model token of each turn [B, T] (token estimators)."""
    policy_logprobs: torch.Tensor | None = None
    """The trainer's own log-probs of the sampled tokens before the update, from the same forward as
    the reference's, for the KL reward penalty [B, T]; None: `old_logprobs` serve (they are the
    trainer's already when another engine sampled). The sampler's own differ from the trainer's by
    float error (much more in bf16), which the penalty would otherwise take for KL."""
    sampler_logprobs: torch.Tensor | None = None
    """The engine's behaviour log-probs as sampled [B, T], kept when `old_logprobs` are replaced by
    the trainer's: the on-policy update measures its own forward against them (`sampler_kl`)."""
    tis_weights: torch.Tensor | None = None
    """Truncated importance weights min(π_trainer / π_sampler, C) per token, when another engine sampled [B, T]."""
    on_policy: bool = False
    """Sampled this step by the weights being trained, so `old_logprobs` are theirs up to float error: the
    batch's first update (the first minibatch of the first pass) then takes π_old from its own forward, detached,
    and its ratio is exactly 1."""

    def select(self, index: torch.Tensor) -> "Batch":
        return Batch(**{k: (v[index] if isinstance(v, torch.Tensor) else v) for k, v in vars(self).items()})

    def real_completion_lengths(self) -> torch.Tensor:
        """Per row, the completion columns up to its last loss token (later ones affect no loss)."""
        width = self.loss_mask.size(1)
        last = torch.where(self.loss_mask.bool(), torch.arange(1, width + 1, device=self.loss_mask.device), 0).amax(dim=1)
        return last

    def trimmed(self) -> "Batch":
        """Without the prompt columns that are padding in every row and the completion columns after
        every row's last loss token: the same log-probs (positions come from the mask, attention is
        causal) on a narrower batch."""
        keep_prompt = self.prompt_mask.bool().any(dim=0).nonzero()
        start = int(keep_prompt[0]) if len(keep_prompt) else self.prompt_mask.size(1) - 1
        end = max(int(self.real_completion_lengths().max()), 1) if self.loss_mask.numel() else 1
        fields = {}
        for key, value in vars(self).items():
            if key in ("prompt_ids", "prompt_mask"):
                value = value[:, start:]
            elif isinstance(value, torch.Tensor) and value.dim() == 2 and value.size(1) == self.loss_mask.size(1):
                value = value[:, :end]
            fields[key] = value
        return Batch(**fields)

    def to(self, device: torch.device) -> "Batch":
        return Batch(**{k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in vars(self).items()})


def make_batch(scored: Scored, cfg: RLConfig, pad_id: int) -> Batch:
    rollout = scored.rollout
    prompt_ids, prompt_mask = left_pad(rollout.prompt_ids, pad_id)
    loss_mask = truncation_mask(rollout.loss_mask, ~scored.trained)
    if cfg.overlong == "mask":
        loss_mask = truncation_mask(loss_mask, rollout.truncated)
    return Batch(prompt_ids, prompt_mask, rollout.completion_ids, loss_mask, rollout.logprobs,
                 turn_rewards=turn_reward_tokens(scored.trajectories, rollout.completion_ids.shape),
                 sampler_logprobs=rollout.logprobs, on_policy=True)


def turn_reward_tokens(trajectories: list[Trajectory], shape: torch.Size) -> torch.Tensor | None:
    """Each turn's environment reward at the turn's last model token, relative to the completion."""
    if not any(r for t in trajectories for r in t.turn_rewards if r is not None):
        return None
    out = torch.zeros(shape)
    for row, t in enumerate(trajectories):
        for (start, end), reward in zip(t.turn_spans, t.turn_rewards):
            if reward is not None and end > start:
                out[row, end - 1 - t.prompt_length] = reward
    return out


def collect(runner: EpisodeRunner, task, stream, rewards: RewardRunner, endings: TerminationPolicy,
            cfg: RLConfig, times: dict[str, float], ctx: Distributed = Distributed()) -> Scored:
    """generate → score, repeated with fresh prompts under dynamic sampling until
    `prompts_per_step` groups have reward variance (or the round cap is hit: an error).

    With several processes each takes its contiguous share of every round's prompts (whole
    groups) and fills its share of the groups; group ids stay unique across processes."""
    kept: list[Scored] = []
    n_kept = sampled = without_signal = 0
    wanted = cfg.prompts_per_step // ctx.world
    for round_ in range(cfg.max_sampling_rounds if cfg.dynamic_sampling else 1):
        start = time.perf_counter()
        mine = ctx.shard(stream.take(cfg.prompts_per_step), "prompts per step")
        problems = [p for p in mine for _ in range(cfg.group_size)]
        trajectories = runner.run(problems)
        times["time_generate"] = times.get("time_generate", 0.0) + time.perf_counter() - start
        start = time.perf_counter()
        first_group = round_ * cfg.prompts_per_step + ctx.rank * wanted
        group_ids = torch.arange(wanted).repeat_interleave(cfg.group_size) + first_group
        scored = score(trajectories, group_ids, runner.tokenizer.pad_token_id, task, rewards, endings, cfg)
        sampled += cfg.prompts_per_step
        signal = groups_with_signal(scored.rewards, group_ids, scored.valid)
        without_signal += int(ctx.all_sum(wanted - len(group_ids[signal].unique())))
        times["time_score"] = times.get("time_score", 0.0) + time.perf_counter() - start
        if not cfg.dynamic_sampling:
            kept, n_kept = [scored], wanted
            break
        keep = signal.nonzero().squeeze(1).tolist()
        keep = keep[: (wanted - n_kept) * cfg.group_size]
        if keep:
            kept.append(_select(scored, keep))
            n_kept += len(keep) // cfg.group_size
        if ctx.all_true(n_kept == wanted):  # every process samples the same rounds
            break
    if not ctx.all_true(n_kept == wanted):
        raise RuntimeError(f"dynamic sampling: after {cfg.max_sampling_rounds} rounds only {n_kept} of "
                           f"{wanted} groups had rewards that differ; raise max_sampling_rounds, "
                           f"lower prompts_per_step, or turn dynamic_sampling off")
    merged = kept[0] if len(kept) == 1 else _merge(kept)
    merged.groups_sampled, merged.groups_without_signal = sampled, without_signal
    return merged


def score(trajectories: list[Trajectory], group_ids: torch.Tensor, pad_id: int, task, rewards: RewardRunner,
          endings: TerminationPolicy, cfg: RLConfig) -> Scored:
    """The total reward is the weighted sum of the reward functions on the final answers (0 where
    unscorable) plus the environment's own rewards; then the termination policy decides which
    trajectories are trained, masked, penalised or excluded."""
    rollout = to_rollout(trajectories, pad_id)
    problems = [t.problem for t in trajectories]
    texts, terminated = [t.final_text for t in trajectories], [t.terminated for t in trajectories]
    grades = grade_all(task, trajectories)
    note_episodes(rewards, trajectories)  # broken episodes said, and the stop when all broke
    scores = rewards.score(task, problems, texts, terminated, grades)
    components = scores.components
    total = sum(weight * components[name] for name, weight in rewards.weights().items())
    env_rewards = torch.tensor([sum(r for r in t.turn_rewards if r is not None) for t in trajectories])
    if any(r is not None for t in trajectories for r in t.turn_rewards):  # the env gave rewards, 0 too
        components["env"] = env_rewards
        total = total + env_rewards
    if cfg.overlong == "penalty":
        components["overlong"] = overlong_penalty(rollout.lengths, cfg.max_new_tokens, cfg.overlong_cache).float()
        total = total + components["overlong"]
    if cfg.missing_eos_penalty:
        components["missing_eos"] = -cfg.missing_eos_penalty * (~torch.tensor(terminated)).float()
        total = total + components["missing_eos"]
    actions = endings.actions([t.termination for t in trajectories])
    if endings.penalty and any(a == "penalise" for a in actions):
        components["termination"] = torch.tensor([-endings.penalty if a == "penalise" else 0.0 for a in actions])
        total = total + components["termination"]
    valid = scores.valid & torch.tensor([a != "exclude" for a in actions])
    trained = torch.tensor([a in ("train", "penalise") for a in actions])
    total = torch.where(valid, total.float(), 0.0)
    unscorable = dict(scores.failures)
    if (excluded := sum(a == "exclude" for a in actions)):
        unscorable["termination"] = excluded
    return Scored(rollout, problems, group_ids, total, components, grades, 0, 0, valid, unscorable,
                  trajectories, env_rewards.float(), trained)


def _select(scored: Scored, index: list[int]) -> Scored:
    rows = torch.tensor(index)
    return Scored(scored.rollout.select(index), [scored.problems[i] for i in index], scored.group_ids[rows],
                  scored.rewards[rows], {k: v[rows] for k, v in scored.components.items()},
                  [scored.grades[i] for i in index], 0, 0, scored.valid[rows], dict(scored.unscorable),
                  [scored.trajectories[i] for i in index], scored.env_rewards[rows], scored.trained[rows])


def _merge(parts: list[Scored]) -> Scored:
    unscorable: dict[str, int] = {}
    for part in parts:
        for name, n in part.unscorable.items():
            unscorable[name] = unscorable.get(name, 0) + n
    return Scored(concat_rollouts([p.rollout for p in parts]), [x for p in parts for x in p.problems],
                  torch.cat([p.group_ids for p in parts]), torch.cat([p.rewards for p in parts]),
                  {k: torch.cat([p.components.get(k, torch.zeros(len(p.rewards))) for p in parts])
                   for k in dict.fromkeys(k for p in parts for k in p.components)},
                  [g for p in parts for g in p.grades], 0, 0, torch.cat([p.valid for p in parts]), unscorable,
                  [t for p in parts for t in p.trajectories], torch.cat([p.env_rewards for p in parts]),
                  torch.cat([p.trained for p in parts]))


def compute_advantages(batch: Batch, scored: Scored, cfg: RLConfig, beta: float,
                       ctx: Distributed = Distributed()) -> dict[str, float]:
    """Fill `batch.advantages` (and `returns` for token estimators); return figures to log.

    With the KL as a reward penalty, each token's reward carries −β·k1 (π_old vs π_ref, both from
    the trainer's forward: exactly 0 while the policy is the reference); a per-sequence estimator
    receives the sequence's sum of it.

    An unscorable completion is left out of its group's baseline and gets advantage 0 (per
    sequence estimators); token estimators drop it from the loss mask, since its returns are
    undefined and neither the policy nor the critic may learn from them."""
    valid = scored.valid
    if not valid.all() and cfg.advantage not in ADVANTAGES:
        batch.loss_mask = batch.loss_mask * valid[:, None]
    mask = batch.loss_mask
    kl_penalty = None
    if cfg.kl_placement == "reward" and batch.ref_logprobs is not None:
        own = batch.policy_logprobs if batch.policy_logprobs is not None else batch.old_logprobs
        kl_penalty = (own - batch.ref_logprobs) * mask  # k1 on the sampled tokens
    rewards = scored.rewards
    if cfg.advantage in ADVANTAGES:
        if kl_penalty is not None:
            rewards = rewards - beta * kl_penalty.sum(dim=1)
        fn = ADVANTAGES.get(cfg.advantage)
        seq_adv = advantages_of_valid(fn, rewards, scored.group_ids, valid,
                                      **options_for(fn, {"std": cfg.std, "scale": cfg.scale, "eps": cfg.advantage_eps}))
        batch.advantages = seq_adv[:, None].expand_as(mask).contiguous()
    else:
        # the environment's per-turn rewards sit on each turn's last model token, the rest of the
        # reward (the outcome) on the trajectory's last model token
        outcome = rewards - scored.env_rewards if batch.turn_rewards is not None else rewards
        per_token = token_rewards(outcome, mask, kl=kl_penalty, beta=beta if kl_penalty is not None else 0.0)
        if batch.turn_rewards is not None:
            per_token = per_token + batch.turn_rewards * mask
        fn = TOKEN_ADVANTAGES.get(cfg.advantage)
        batch.advantages, batch.returns = fn(per_token, mask, values=batch.old_values, gamma=cfg.gamma,
                                             lam=cfg.gae_lambda)
    if cfg.whiten_advantages and cfg.whiten_over == "sequences":  # one value per scored sequence
        seq_adv = whiten_sequences(seq_adv, valid, eps=cfg.whiten_eps, unbiased=cfg.whiten_std == "sample")
        batch.advantages = seq_adv[:, None].expand_as(mask).contiguous()
    elif cfg.whiten_advantages:
        batch.advantages = masked_whiten(batch.advantages, mask, eps=cfg.whiten_eps, unbiased=cfg.whiten_std == "sample")
    figures = {}
    if kl_penalty is not None:  # over every process's tokens, so that each adapts β alike (--target_kl)
        tokens = ctx.all_sum(mask.sum().item())
        if tokens:  # with no trained token there is no measurement
            figures["kl_reward"] = ctx.all_sum(kl_penalty.sum().item()) / tokens
    return figures
