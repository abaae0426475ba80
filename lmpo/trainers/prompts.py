"""A reproducible, resumable stream of training prompts."""

from __future__ import annotations

import random
from typing import Sequence

from lmpo.envs import Problem


class PromptStream:
    """Iterates a pool of problems in a fresh shuffled order each epoch.

    `position` (prompts taken so far) is the whole state: a resumed run sets it and then sees
    exactly the prompts an uninterrupted run would have seen.
    """

    def __init__(self, pool: Sequence[Problem], seed: int):
        if not pool:
            raise ValueError("the prompt pool is empty")
        self.pool, self.seed, self.position = list(pool), seed, 0
        self._epoch, self._order = -1, []

    def _order_for(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            self._order = list(range(len(self.pool)))
            random.Random(f"prompt-order:{self.seed}:{epoch}").shuffle(self._order)
            self._epoch = epoch
        return self._order

    def take(self, n: int) -> list[Problem]:
        out = []
        for _ in range(n):
            epoch, offset = divmod(self.position, len(self.pool))
            out.append(self.pool[self._order_for(epoch)[offset]])
            self.position += 1
        return out
