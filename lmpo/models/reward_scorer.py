"""A trained reward model as a reward function (RL from a learned reward)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer


from lmpo.models.loading import load_model
from lmpo.models.logprobs import context_length
from lmpo.models.lora import adapter_base_name, attach_adapter, is_adapter_dir
from lmpo.models.padding import right_pad


def last_token_scores(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """A sequence classifier's one-label score [B] at each row's last real token (the attention
    mask's last 1), where a reward model's packed training forward reads it. transformers' own
    pooling reads the last token that is not the pad token: where the pad token is the EOS (GPT-2,
    Llama 3 base: the usual fallback), that is the token before a row's closing EOS, so a reward
    model trained at the EOS was evaluated and used one token early. The head's output at every
    position is taken on its way out of the head (a forward hook), so the model runs as it is."""
    labels = getattr(getattr(model, "config", None), "num_labels", 1)
    if labels != 1:  # per_token[..., 0] would read the first label's logit as the score
        raise ValueError(f"reward model {getattr(model, 'name_or_path', '') or type(model).__name__} has {labels} "
                         f"labels, not one: a reward model gives one score per sequence")
    head = _score_head(model)
    if head is None:  # not a transformers sequence classifier: its own pooling
        return model(input_ids=input_ids, attention_mask=attention_mask).logits[:, 0].float()
    seen = []
    handle = head.register_forward_hook(lambda module, args, output: seen.append(output))
    try:
        model(input_ids=input_ids, attention_mask=attention_mask)
    finally:
        handle.remove()
    per_token = seen[-1]
    positions = torch.arange(attention_mask.size(1), device=attention_mask.device)
    last = (positions * attention_mask.long()).argmax(dim=1).to(per_token.device)
    return per_token[torch.arange(per_token.size(0), device=per_token.device), last, 0].float()


def _score_head(model: torch.nn.Module) -> torch.nn.Module | None:
    """The classification head (`score`, or `classifier`), outermost first (under PEFT, its wrapper)."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in ("score", "classifier"):
            return module
    return None


def _classifier_base(base: str) -> torch.nn.Module:
    """The base a LoRA reward model's adapter loads on, as a one-label classifier. A base that is
    itself an adapter (`train rm --lora_r` on a LoRA stage's model/) is that stage's model merged,
    as the reward trainer loaded it; the score head then comes from the reward model's adapter."""
    if not is_adapter_dir(base):
        return AutoModelForSequenceClassification.from_pretrained(base, num_labels=1, trust_remote_code=False)
    causal = load_model(base, AutoTokenizer.from_pretrained(base, trust_remote_code=False))
    config = copy.deepcopy(causal.config)
    config.num_labels = 1
    model = AutoModelForSequenceClassification.from_config(config)
    model.base_model.load_state_dict(causal.base_model.state_dict())
    return model


class RewardModelReward:
    """Scores `prompt + completion` (+ EOS when the completion ended with it) with an
    `AutoModelForSequenceClassification` directory, e.g. one written by `lmpo train rm`. The
    score is read at the last non-padding token, as the reward model was trained."""

    def __init__(self, path: str, *, encode_prompt: Callable[[Any, str], list[int]], batch_size: int = 256,
                 encode_row: Callable[..., list[int]] | None = None, turn_ends: Sequence[int] = ()):
        """`encode_prompt(tokenizer, text)`: a prompt's ids as training encoded them (with the
        tokenizer's leading special tokens: `lmpo.envs.data.chat.encode_start`). A reward model
        trained on chat rows gives `encode_row(tokenizer, prompt or messages, completion, terminated,
        turn_ends, tools)` instead (`lmpo.envs.data.reward_rows.chat_reward_row`): the row as its template
        renders it, closed by the end-of-turn token it was trained on (Gemma's `<end_of_turn>`,
        not the tokenizer's eos)."""
        self.path, self.encode_prompt, self.batch_size = path, encode_prompt, batch_size
        self.encode_row, self.turn_ends = encode_row, list(turn_ends)
        self.model = self.tokenizer = None

    def __repr__(self) -> str:
        return f"rm ({self.path})"

    def setup(self) -> None:
        """Load the model (on first use, so that a worker process, not the trainer, holds it)."""
        if self.model is not None:
            return
        if is_adapter_dir(self.path):
            model = self._merged_adapter()
        else:
            # never the terminal prompt transformers puts up for a model with its own code
            model, info = AutoModelForSequenceClassification.from_pretrained(self.path, trust_remote_code=False,
                                                                               output_loading_info=True)
            if info["missing_keys"]:  # e.g. a causal LM's checkpoint: the head would be freshly initialised
                raise ValueError(f"reward model {self.path}: its checkpoint has no "
                                 f"{', '.join(sorted(info['missing_keys'])[:3])}: loaded as a reward model it would "
                                 f"score with an untrained head; give a directory written by `lmpo train rm`")
        labels = getattr(model.config, "id2label", None) or {}
        if model.config.num_labels != 1:  # its score would be the first label's logit alone
            raise ValueError(f"reward model {self.path}: a classifier with {model.config.num_labels} labels "
                             f"({', '.join(map(str, labels.values()))[:80]}), not one score; give a directory "
                             f"written by `lmpo train rm` (or any ...ForSequenceClassification model with one label)")
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = AutoTokenizer.from_pretrained(self.path, trust_remote_code=False)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.config.pad_token_id = self.tokenizer.pad_token_id

    def _merged_adapter(self):
        """A LoRA reward model (`lmpo train rm --lora_r N`): its base as a one-label classifier, the
        adapter and its trained score head loaded on top, merged. A head the adapter does not
        carry would stay freshly initialised, so it is refused."""
        from safetensors import safe_open

        weights = Path(self.path) / "adapter_model.safetensors"
        with safe_open(str(weights), "pt") as f:
            if not any(key.split(".")[-2] in ("score", "classifier") for key in f.keys() if key.count(".") >= 1):
                raise ValueError(f"reward model {self.path}: its adapter carries no score head (modules_to_save), so "
                                 f"its head would be untrained; give a directory written by `lmpo train rm`")
        base = _classifier_base(adapter_base_name(self.path))
        return attach_adapter(base, self.path, trainable=False).merge_and_unload()

    def __getstate__(self) -> dict:  # sent to a worker as its path; the worker loads the weights
        return {"path": self.path, "encode_prompt": self.encode_prompt, "batch_size": self.batch_size, "model": None,
                "tokenizer": None, "encode_row": self.encode_row, "turn_ends": self.turn_ends}

    def rows(self, problems: Sequence, completions: Sequence[str], terminated: Sequence[bool]) -> list[list[int]]:
        """The token ids scored for each completion, as training encoded its rows. A chat reward
        model renders a prompt given as messages (`problem.messages`, with `problem.tools`) with its
        own template, once, as `lmpo train rm` rendered them; `problem.prompt` is then the policy's
        rendering, which read as one user turn would be wrapped in a second template."""
        self.setup()
        tok = self.tokenizer
        if self.encode_row is not None:
            ends = self.turn_ends or [tok.eos_token_id]
            return [self.encode_row(tok, getattr(p, "messages", None) or p.prompt, c, t, ends,
                                    getattr(p, "tools", None)) for p, c, t in zip(problems, completions, terminated)]
        # prompt and reply tokenised apart, as in training (lmpo.trainers.pairs.scoring_rows)
        return [self.encode_prompt(tok, p.prompt) + tok(c, add_special_tokens=False).input_ids
                + ([tok.eos_token_id] if t else []) for p, c, t in zip(problems, completions, terminated)]

    @torch.no_grad()
    def __call__(self, task, problems: Sequence, completions: Sequence[str],
                 terminated: Sequence[bool]) -> list[float]:
        self.setup()
        tok, scores = self.tokenizer, []
        ids = self.rows(problems, completions, terminated)
        context = context_length(self.model)
        longest = max(range(len(ids)), key=lambda i: len(ids[i]), default=None)
        if context is not None and longest is not None and len(ids[longest]) > context:
            # past its last position a model with learned positions fails with an IndexError, and
            # one with rotary positions scores text longer than any it was trained on
            raise ValueError(f"the reward model's context is {context} tokens, and a prompt with its completion "
                             f"makes {len(ids[longest])} (prompt {problems[longest].prompt[:60]!r}...); use a reward "
                             f"model with a longer context, or shorter prompts or --max_new_tokens")
        for start in range(0, len(ids), self.batch_size):
            input_ids, mask = right_pad(ids[start:start + self.batch_size], tok.pad_token_id)
            scores.extend(last_token_scores(self.model, input_ids, mask).tolist())
        return scores
