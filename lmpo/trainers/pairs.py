"""Preference data as token ids, for DPO, ORPO, KTO and reward-model training: the task's embedded
pairs, or a user's file (`prompt`/`chosen`/`rejected`, strings or message lists); for KTO the
same pairs unpaired, or a user's file of `prompt`/`completion`/`label` rows."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from lmpo.envs.data import PreferencePair, load_preferences
from lmpo.envs.data.chat import starting
from lmpo.envs.data.unpaired import UnpairedExample, load_unpaired
from lmpo.rollout import right_pad
from lmpo.trainers.distributed import say
from lmpo.trainers.preflight import example_limit


@dataclass
class PairColumns:
    """The columns of a --data file of pairs that hold the prompt and the two replies."""

    prompt_field: str = "prompt"
    """The column of --data holding each pair's prompt (e.g. question, StackExchange's)."""
    chosen_field: str = "chosen"
    """The column of --data holding the preferred reply (e.g. response_j, StackExchange's)."""
    rejected_field: str = "rejected"
    """The column of --data holding the other reply (e.g. response_k)."""

    def columns(self) -> dict[str, str]:
        return {self.prompt_field: "prompt", self.chosen_field: "chosen", self.rejected_field: "rejected"}


@dataclass
class UnpairedColumns:
    """The columns of a --data file of KTO examples."""

    prompt_field: str = "prompt"
    """The column of --data holding each example's prompt (e.g. question)."""
    completion_field: str = "completion"
    """The column of --data holding the example's reply (e.g. response)."""
    label_field: str = "label"
    """The column of --data saying whether the reply is desirable (true/false, e.g. thumbs_up)."""

    def columns(self) -> dict[str, str]:
        return {self.prompt_field: "prompt", self.completion_field: "completion", self.label_field: "label"}


def embedded_pairs(task, tokenizer, n: int, seed: int, heldout: bool = False) -> list[PreferencePair]:
    """The task's generated pairs: chosen = a right answer, rejected = a wrong one; EOS ends each reply."""
    if not hasattr(task, "preference_pairs"):
        raise ValueError(f"task {task.name!r} has no embedded preference pairs; give a file with --data")
    eos = tokenizer.eos_token_id

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False).input_ids

    return [PreferencePair(starting(tokenizer, ids(p.prompt)), ids(chosen) + [eos], ids(rejected) + [eos])
            for p, chosen, rejected in task.preference_pairs(n, seed, heldout=heldout)]


def file_pairs(path: str, tokenizer, cfg, shapes: list[str] | None = None) -> list[PreferencePair]:
    """The pairs of `path`, held to `cfg.max_length` and the context of `cfg.model`; the file's
    row shape is appended to `shapes` when given."""
    max_length, limit_name = example_limit(cfg.model, tokenizer, cfg.max_length)
    pairs, report = load_preferences(path, tokenizer, max_length=max_length, overlong=cfg.overlong,
                                     limit_name=limit_name, columns=cfg.columns())
    say(f"[data] {report.summary()}")
    if shapes is not None:
        shapes.append(report.shape)
    return pairs


def unpair(pairs: list[PreferencePair]) -> list[UnpairedExample]:
    """Each pair as two examples, its chosen reply desirable and its rejected one not (as TRL's
    `unpair_preference_dataset`): on the embedded task, right answers and wrong ones."""
    return [example for p in pairs for example in (UnpairedExample(p.prompt_ids, p.chosen_ids, True),
                                                   UnpairedExample(p.prompt_ids, p.rejected_ids, False))]


def file_unpaired(path: str, tokenizer, cfg) -> list[UnpairedExample]:
    """The examples of `path`, held to `cfg.max_length` and the context of `cfg.model`."""
    max_length, limit_name = example_limit(cfg.model, tokenizer, cfg.max_length)
    examples, report = load_unpaired(path, tokenizer, max_length=max_length, overlong=cfg.overlong,
                                     limit_name=limit_name, columns=cfg.columns())
    desirable = sum(e.desirable for e in examples)
    say(f"[data] {report.summary()}; {desirable} desirable, {len(examples) - desirable} undesirable")
    return examples


def split_heldout(pairs: list[PreferencePair], n_heldout: int, seed: int,
                  source: str) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """A seeded random `n_heldout` of a file's pairs for evaluation; the rest for training."""
    if n_heldout <= 0:
        return pairs, []
    if n_heldout >= len(pairs):
        raise ValueError(f"{source} has {len(pairs)} pairs: too few to hold out {n_heldout} for evaluation "
                         f"and train on the rest (lower heldout_pairs or give heldout_data)")
    order = list(range(len(pairs)))
    random.Random(f"heldout-pairs:{seed}").shuffle(order)
    held = set(order[:n_heldout])
    return [p for i, p in enumerate(pairs) if i not in held], [pairs[i] for i in sorted(held)]


def scoring_rows(pairs: list[PreferencePair], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For a reward model: chosen rows (prompt + chosen) then rejected rows, right-padded."""
    rows = [p.prompt_ids + p.chosen_ids for p in pairs] + [p.prompt_ids + p.rejected_ids for p in pairs]
    return right_pad(rows, pad_id)
