"""A trained reward model as a reward function (RL from a learned reward)."""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from lmpo.envs.base import Problem, Task
from lmpo.rollout import right_pad


class RewardModelReward:
    """Scores `prompt + completion` (+ EOS when the completion ended with it) with an
    `AutoModelForSequenceClassification` directory, e.g. one written by `lmpo train rm`. The
    score is read at the last non-padding token, as the reward model was trained."""

    def __init__(self, path: str, batch_size: int = 256):
        self.model = AutoModelForSequenceClassification.from_pretrained(path).eval().requires_grad_(False)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.batch_size = batch_size

    @torch.no_grad()
    def __call__(self, task: Task, problems: Sequence[Problem], completions: Sequence[str],
                 terminated: Sequence[bool]) -> list[float]:
        tok, scores = self.tokenizer, []
        ids = [tok(p.prompt + c, add_special_tokens=False).input_ids + ([tok.eos_token_id] if t else [])
               for p, c, t in zip(problems, completions, terminated)]
        for start in range(0, len(ids), self.batch_size):
            input_ids, mask = right_pad(ids[start:start + self.batch_size], tok.pad_token_id)
            logits = self.model(input_ids=input_ids, attention_mask=mask).logits
            scores.extend(logits[:, 0].float().tolist())
        return scores
