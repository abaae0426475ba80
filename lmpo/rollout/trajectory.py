"""The record every consumer of sampled episodes reads: RL, online DPO and evaluation.

A trajectory is the token ids of one episode as the model saw them, each token labelled with
where it came from. The loss mask is derived from those labels, never kept separately: only
the tokens the model sampled (including the EOS it sampled) are trained; the prompt, the chat
template's markers and the environment's observations never are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lmpo.envs.base import Problem
from lmpo.envs.env import ANSWERED, ENV_DONE, LENGTH_ENDINGS
from lmpo.rollout.types import FINISH_EOS, FINISH_LENGTH, Rollout

PROMPT, MODEL, TEMPLATE, ENV = 0, 1, 2, 3
SOURCE_NAMES = ("prompt", "model", "template", "env")


@dataclass
class Sample:
    """One engine generation: the sampled ids (EOS included when sampled), their behaviour
    log-probs in fp32, and why generation stopped ("eos" or "length")."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


@dataclass
class Trajectory:
    problem: Problem
    prompt_length: int
    """Tokens of the opening prompt (rendered messages and the generation prompt)."""
    token_ids: list[int] = field(default_factory=list)
    sources: list[int] = field(default_factory=list)
    """Per token: PROMPT, MODEL, TEMPLATE or ENV."""
    logprobs: list[float] = field(default_factory=list)
    """Behaviour log-probs on model tokens, 0.0 elsewhere."""
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    """[start, end) of each model turn in `token_ids`."""
    turn_rewards: list[float | None] = field(default_factory=list)
    """The environment's reward for each model turn (None: none given)."""
    termination: str = ""
    final_text: str = ""
    """The last model turn's text before EOS (the answer, when the episode ended with one)."""
    last_turn_eos: bool = False
    env_reward: float | None = None
    """The environment's reward at the end of the episode, when it gives one."""
    tool_calls: int = 0
    parse_errors: int = 0
    messages: list[dict] = field(default_factory=list)
    info: dict = field(default_factory=dict)

    @property
    def terminated(self) -> bool:
        """The episode ended with an answer that the model closed with EOS (what graders call terminated)."""
        return self.termination in (ANSWERED, ENV_DONE) and self.last_turn_eos

    @property
    def truncated(self) -> bool:
        """A length limit cut the episode's last turn off before EOS. An episode that never
        sampled (its environment failed to start) was cut by nothing."""
        return not self.last_turn_eos and self.termination in LENGTH_ENDINGS

    @property
    def completion_ids(self) -> list[int]:
        return self.token_ids[self.prompt_length:]

    @property
    def loss_mask(self) -> list[int]:
        """1 on the tokens the model sampled after the prompt, 0 on everything else."""
        return [int(s == MODEL) for s in self.sources[self.prompt_length:]]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_model_tokens(self) -> int:
        return sum(s == MODEL for s in self.sources)

    @property
    def turns(self) -> int:
        return len(self.turn_spans)

    def segments(self, tokenizer) -> list[dict]:
        """Runs of tokens with one source, decoded for people (JSONL, the terminal, the report)."""
        out: list[dict] = []
        start = 0
        turn_of = {s: k for k, (s, _) in enumerate(self.turn_spans)}
        for i in range(1, len(self.sources) + 1):
            if i == len(self.sources) or self.sources[i] != self.sources[start] or i in turn_of:
                segment = {"source": SOURCE_NAMES[self.sources[start]],
                           "text": tokenizer.decode(self.token_ids[start:i], skip_special_tokens=False)}
                if start in turn_of:
                    segment["turn"] = turn_of[start]
                out.append(segment)
                start = i
        return out


def to_rollout(trajectories: list[Trajectory], pad_id: int) -> Rollout:
    """Trajectories laid out for the loss: prompts unpadded, everything after the prompt
    right-padded. `lengths` counts every token after the prompt (observations included), so a
    trajectory with tool output in the middle is never cut short. `finish_reasons` is "length"
    only for a trajectory a length limit cut off (`Trajectory.truncated`)."""
    completions = [t.completion_ids for t in trajectories]
    width = max(1, max(len(c) for c in completions))
    # right-padded as lists, then one tensor each (a tensor per row costs more than its contents)
    ids = torch.tensor([list(c) + [pad_id] * (width - len(c)) for c in completions], dtype=torch.long)
    mask = torch.tensor([list(t.loss_mask) + [0.0] * (width - len(c))
                         for t, c in zip(trajectories, completions)], dtype=torch.float32)
    logprobs = torch.tensor([list(t.logprobs[t.prompt_length:]) + [0.0] * (width - len(c))
                             for t, c in zip(trajectories, completions)], dtype=torch.float32)
    return Rollout(prompt_ids=[t.token_ids[:t.prompt_length] for t in trajectories], completion_ids=ids,
                   loss_mask=mask, logprobs=logprobs,
                   finish_reasons=[FINISH_LENGTH if t.truncated else FINISH_EOS for t in trajectories],
                   pad_id=pad_id, lengths=torch.tensor([len(c) for c in completions], dtype=torch.long))
