"""The data orders of the supervised stages, each restorable exactly from a checkpoint: epochs
of shuffled indices (SFT, the reward model), a packed token stream (CPT), and the task's own
documents and demonstrations rendered for them."""

from __future__ import annotations

import random

import torch

from lmpo.envs.data import Record, TokenizedExample
from lmpo.envs.data.chat import encode_conversation, starting
from lmpo.envs.env import tool_schemas, uses_chat_template
from lmpo.rollout import right_pad


class EpochOrder:
    """Batches of indices into `size` items, in a fresh shuffled order each epoch.

    Restorable exactly: the state is the epoch, the position within it and the order RNG's
    state at the epoch's start (the epoch's order is shuffled again from it).
    """

    def __init__(self, size: int, batch_size: int, epochs: int, seed: str):
        self.size, self.batch_size, self.epochs = size, batch_size, epochs
        self._rng = random.Random(seed)
        self.epoch, self.position = -1, size  # before the first epoch
        self._epoch_start: tuple | None = None
        self._order: list[int] = []

    def __iter__(self) -> "EpochOrder":
        return self

    def __next__(self) -> list[int]:
        while self.at_epoch_end:
            if self.epoch + 1 >= self.epochs:
                raise StopIteration
            self._start_epoch(self.epoch + 1)
        chunk = self._order[self.position:self.position + self.batch_size]
        self.position += len(chunk)
        return chunk

    @property
    def at_epoch_end(self) -> bool:
        return self.position >= self.size

    def _start_epoch(self, epoch: int) -> None:
        self.epoch, self.position = epoch, 0
        self._epoch_start = self._rng.getstate()
        self._order = list(range(self.size))
        self._rng.shuffle(self._order)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "rng": self._epoch_start}

    def load_state_dict(self, state: dict) -> None:
        if state["epoch"] >= 0:
            self._rng.setstate(state["rng"])
            self._start_epoch(state["epoch"])
        self.position = state["position"]


class CPTBatches:
    """A token stream (documents each ending with EOS) cut into rows of `seq_len + 1` tokens,
    shuffled each pass; loss on every token. Yields (ids, loss mask, None) for `steps` steps.

    Restorable exactly: the state is the permutation generator's state at the start of the
    current pass (the pass's order is drawn again from it) and the position within the pass.
    """

    def __init__(self, stream: list[int], seq_len: int, batch_size: int, steps: int, seed: int):
        self.rows = torch.tensor(stream[: len(stream) // (seq_len + 1) * (seq_len + 1)]).view(-1, seq_len + 1)
        if len(self.rows) < batch_size:
            raise ValueError(f"the corpus packs into {len(self.rows)} rows of {seq_len + 1} tokens, "
                             f"fewer than one batch of {batch_size}")
        self.batch_size, self.steps, self.taken = batch_size, steps, 0
        self._gen = torch.Generator().manual_seed(seed)
        self._new_pass()

    def _new_pass(self) -> None:
        self._pass_start = self._gen.get_state()
        self._order = torch.randperm(len(self.rows), generator=self._gen)
        self._position = 0

    def __iter__(self) -> "CPTBatches":
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor, None]:
        if self.taken >= self.steps:
            raise StopIteration
        if self.at_epoch_end:
            self._new_pass()
        batch = self.rows[self._order[self._position:self._position + self.batch_size]]
        self._position += self.batch_size
        self.taken += 1
        return batch, torch.ones_like(batch, dtype=torch.float32), None

    @property
    def at_epoch_end(self) -> bool:
        return self._position + self.batch_size > len(self._order)

    def state_dict(self) -> dict:
        return {"pass_start": self._pass_start, "position": self._position, "taken": self.taken}

    def load_state_dict(self, state: dict) -> None:
        self._gen.set_state(state["pass_start"])
        self._new_pass()
        self._position, self.taken = state["position"], state["taken"]


def task_documents(task, tokenizer, n: int, seed: int) -> list[str]:
    """The task's CPT corpus as text; a conversation task's traces are rendered with the chat template."""
    docs = task.cpt_corpus(n, seed)
    if uses_chat_template(task):
        tools = tool_schemas(task)
        return [tokenizer.apply_chat_template(conversation, tokenize=False, **({"tools": tools} if tools else {}))
                for conversation in docs]
    return docs


def task_document_ids(task, tokenizer, n: int, seed: int) -> list[list[int]]:
    """The ids of `task_documents`, each after the tokenizer's leading special tokens (its BOS,
    where it adds one) and ending with EOS."""
    eos = tokenizer.eos_token_id
    docs = (starting(tokenizer, ids) for ids in
            tokenizer(task_documents(task, tokenizer, n, seed), add_special_tokens=False).input_ids)
    return [ids if ids[-1:] == [eos] else [*ids, eos] for ids in docs]


def task_examples(tokenizer, demonstrations: list, task=None) -> list[TokenizedExample]:
    """Prompt (no loss) + answer + EOS (loss), in the task's own layout; a conversation task's
    demonstrations are rendered with the chat template, with loss on every assistant turn."""
    if task is not None and uses_chat_template(task):
        tools = tool_schemas(task)
        row = {"tools": tools} if tools else {}
        return [TokenizedExample(*encode_conversation(Record(f"task {task.name}", i + 1, row), "messages", tokenizer, c))
                for i, c in enumerate(demonstrations)]
    examples = []
    for p in demonstrations:
        prompt = starting(tokenizer, tokenizer(p.prompt, add_special_tokens=False).input_ids)
        answer = tokenizer(p.answer, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        examples.append(TokenizedExample(prompt + answer, [0] * len(prompt) + [1] * len(answer)))
    return examples


class SFTBatches:
    """Right-padded batches in a fresh shuffled order each epoch: ids, loss mask, attention mask."""

    def __init__(self, examples: list[TokenizedExample], pad_id: int, batch_size: int, epochs: int, seed: int):
        self.examples, self.pad_id = examples, pad_id
        self.order = EpochOrder(len(examples), batch_size, epochs, f"sft-order:{seed}")

    def __iter__(self) -> "SFTBatches":
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        chunk = [self.examples[i] for i in next(self.order)]
        ids, attention = right_pad([e.input_ids for e in chunk], self.pad_id)
        loss_mask, _ = right_pad([e.loss_mask for e in chunk], 0.0, dtype=torch.float32)
        return ids, loss_mask, attention

    @property
    def at_epoch_end(self) -> bool:
        return self.order.at_epoch_end

    def state_dict(self) -> dict:
        return self.order.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.order.load_state_dict(state)
