"""How a reward model's rows are encoded, so that the `rm` reward scores a completion as the
reward model was trained on it: text rows (prompt, reply, eos) or chat rows (the chat template's
turns, each reply through its end-of-turn token; a prompt given as messages rendered once, from
its messages)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmpo.envs.data.chat import encode, encode_start

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


REWARD_ROWS_FILE = "lmpo_reward_rows.json"
"""Written by `lmpo train rm` beside its model: how its rows were encoded ("chat": rendered with
the chat template, each reply through its end-of-turn token; "text": prompt, reply and eos), and
the end-of-turn tokens, so that the `rm` reward scores completions the same way."""


def chat_reward_row(tokenizer: PreTrainedTokenizerBase, prompt: str | list[dict], completion: str, terminated: bool,
                    turn_ends: list[int], tools: list[dict] | None = None) -> list[int]:
    """A completion to score as a chat reward model was trained on it: the prompt rendered with
    the generation prompt (its messages, a prompt file's row as `Problem.messages` keeps them,
    with the row's `tools`; a text prompt as one user turn), then the reply as the template
    renders it, through its first end-of-turn token (`turn_ends`) when the completion ended
    there; a cut-off completion is the reply's text alone (no turn end was sampled)."""
    turns = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    extra = {"tools": tools} if tools else {}
    head = encode_start(tokenizer, tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True,
                                                                 **extra), count=False)
    if not terminated:
        return head + encode(tokenizer, completion, count=False)
    whole = tokenizer.apply_chat_template([*turns, {"role": "assistant", "content": completion}], tokenize=False,
                                          **extra)
    ids = encode_start(tokenizer, whole, count=False)
    reply = ids[len(head):] if ids[:len(head)] == head else encode(tokenizer, completion, count=False)
    end = next((i for i, token in enumerate(reply) if token in turn_ends), None)
    return head + (reply[:end + 1] if end is not None else reply + turn_ends[:1])
