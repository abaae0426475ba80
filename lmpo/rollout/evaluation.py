"""Held-out evaluation with greedy decoding, graded by the task's own grader."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lmpo.envs.base import Grade, Problem, Task
from lmpo.rollout import FINISH_EOS, Rollout, SamplingParams, generate


@dataclass
class EvalResult:
    accuracy: float
    format_accuracy: float
    n: int
    examples: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"accuracy": self.accuracy, "format_accuracy": self.format_accuracy, "n": self.n}


def encode_prompts(tokenizer: PreTrainedTokenizerBase, problems: Sequence[Problem]) -> list[list[int]]:
    return [tokenizer(p.prompt, add_special_tokens=False).input_ids for p in problems]


def decode_completions(tokenizer: PreTrainedTokenizerBase, rollout: Rollout) -> tuple[list[str], list[bool]]:
    """Completion texts without the final EOS, and whether each ended with EOS."""
    texts, terminated = [], []
    for tokens, reason in zip(rollout.completion_token_lists(), rollout.finish_reasons):
        ended = reason == FINISH_EOS
        texts.append(tokenizer.decode(tokens[:-1] if ended else tokens, skip_special_tokens=False))
        terminated.append(ended)
    return texts, terminated


def grade_all(task: Task, problems: Sequence[Problem], texts: Sequence[str], terminated: Sequence[bool]) -> list[Grade]:
    return [task.grade(p, c, t) for p, c, t in zip(problems, texts, terminated)]


@torch.no_grad()
def evaluate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, task: Task,
             problems: Sequence[Problem], *, max_new_tokens: int = 16, batch_size: int = 256,
             n_examples: int = 5) -> EvalResult:
    """Greedy accuracy and format accuracy on `problems`."""
    grades: list[Grade] = []
    examples: list[dict] = []
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    for start in range(0, len(problems), batch_size):
        chunk = problems[start:start + batch_size]
        rollout = generate(model, encode_prompts(tokenizer, chunk), params,
                           eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id)
        texts, terminated = decode_completions(tokenizer, rollout)
        chunk_grades = grade_all(task, chunk, texts, terminated)
        grades.extend(chunk_grades)
        for p, text, g in zip(chunk, texts, chunk_grades):
            if len(examples) < n_examples:
                examples.append({"prompt": p.prompt, "completion": text, "answer": p.answer, "correct": g.correct})
    n = max(len(grades), 1)
    return EvalResult(accuracy=sum(g.correct for g in grades) / n,
                      format_accuracy=sum(g.well_formed for g in grades) / n, n=len(grades), examples=examples)
