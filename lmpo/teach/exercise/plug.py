"""Where an exercise's function goes in a training run, and putting it there for one run only."""

from __future__ import annotations

import inspect
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from lmpo.algos import Registry


@dataclass(frozen=True)
class Plug:
    """How `lmpo exercise train` runs a user's function in a training stage."""

    stage: str
    """"rl" (a GRPO-family run of the RL loop) or "dpo" (offline preference optimisation)."""
    registry: Registry
    """The registry the stage picks this kind of function from by name."""
    option: str
    """The config field that names the function (``advantage``, ``loss``, ``kl_estimator``...)."""
    reference: str
    """The library function's name in that registry: the comparison run uses it."""
    settings: dict = field(default_factory=dict)
    """Config values of both runs; ``preset`` names the RL preset they start from (default grpo)."""
    role: str = ""
    """What the function is in the stage, in words."""
    wrap: Callable[[Callable], Callable] | None = None
    """Adapts the user's function to the registry's calling convention (None: used as it is)."""
    own_name: bool = False
    """Run under the reference's own name, swapped in for the run (RLConfig accepts a critic only
    with ``advantage="gae"``); otherwise under a fresh, unique name."""


@contextmanager
def plugged(registry: Registry, fn: Callable[..., Any], name: str | None = None,
            stem: str = "exercise") -> Iterator[str]:
    """Register `fn` for the duration of the block, under `name` (replacing that entry) or a fresh
    name: `stem` (the name the trainer's log shows, e.g. ``your_grpo_advantages``), made unique when
    taken; the registry is exactly as before afterwards, whatever happens inside."""
    saved = registry.unregister(name) if name is not None else None
    if name is None:
        name = stem if stem not in registry else f"{stem}_{uuid.uuid4().hex[:8]}"
    registry.register(name)(fn)
    try:
        yield name
    finally:
        registry.unregister(name)
        if saved is not None:
            registry.register(name)(saved)


def keywords_taken(fn: Callable[..., Any], available: dict[str, Any]) -> dict[str, Any]:
    """The options of `available` that `fn` has a parameter for (a user's function may omit some)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(available)
    return {k: v for k, v in available.items() if k in params}
