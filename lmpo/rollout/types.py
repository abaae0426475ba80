"""Typed records that the rollout engines return."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. `temperature == 0` means greedy decoding."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


FINISH_EOS = "eos"
FINISH_LENGTH = "length"


@dataclass
class Rollout:
    """A batch of sampled completions.

    Per token (shape [N, T], right-padded): `completion_ids`, `loss_mask` (1 where the token
    was written by the model and counts in the loss; 0 for padding and, in multi-turn
    rollouts, for tool or environment output), `logprobs` (behaviour log-probs in fp32 under
    the temperature-scaled distribution, before top-p/top-k truncation; 0 on padding).
    Per sequence: `prompt_ids` (unpadded), `lengths` (every token after the prompt, EOS and
    any tool output included) and `finish_reasons` ("eos" or "length"). Multi-turn episodes
    reach the loss as `Trajectory` records laid out by `trajectory.to_rollout`.
    """

    prompt_ids: list[list[int]]
    completion_ids: torch.Tensor
    loss_mask: torch.Tensor
    logprobs: torch.Tensor
    finish_reasons: list[str]
    pad_id: int
    lengths: torch.Tensor
    extras: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.prompt_ids)

    @property
    def truncated(self) -> torch.Tensor:
        return torch.tensor([r == FINISH_LENGTH for r in self.finish_reasons])

    def completion_token_lists(self) -> list[list[int]]:
        lengths = self.lengths.tolist()
        return [row[:n] for row, n in zip(self.completion_ids.tolist(), lengths)]

    def select(self, index: list[int]) -> "Rollout":
        """The sequences at `index`, in that order."""
        rows = torch.tensor(index, dtype=torch.long)
        return Rollout([self.prompt_ids[i] for i in index], self.completion_ids[rows], self.loss_mask[rows],
                       self.logprobs[rows], [self.finish_reasons[i] for i in index], self.pad_id,
                       self.lengths[rows], dict(self.extras))


def concat_rollouts(rollouts: list[Rollout]) -> Rollout:
    """One rollout of all sequences, completions right-padded to the widest."""
    if not rollouts:
        raise ValueError("nothing to concatenate")
    width = max(r.completion_ids.size(1) for r in rollouts)

    def pad(t: torch.Tensor, value: float) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, width - t.size(1)), value=value)

    first = rollouts[0]
    return Rollout(
        prompt_ids=[p for r in rollouts for p in r.prompt_ids],
        completion_ids=torch.cat([pad(r.completion_ids, first.pad_id) for r in rollouts]),
        loss_mask=torch.cat([pad(r.loss_mask, 0.0) for r in rollouts]),
        logprobs=torch.cat([pad(r.logprobs, 0.0) for r in rollouts]),
        finish_reasons=[f for r in rollouts for f in r.finish_reasons],
        pad_id=first.pad_id,
        lengths=torch.cat([r.lengths for r in rollouts]),
    )
