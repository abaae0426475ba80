"""Weighted sums of preference losses, selected by name like a single loss.

A spec ``"dpo=0.8,bco_pair=0.2,sft=1"`` (comma-separated ``name=weight``; a bare ``name`` has
weight 1) names the loss ``sum_k w_k * loss_k``, every part evaluated on the same batch with the
same beta, lengths and options (MPO, Wang et al. 2024, arXiv:2411.10442, uses exactly that
spec; TRL's ``loss_type=[...]`` with ``loss_weights=[...]``). `PreferenceLossRegistry.get`
accepts such a spec wherever a loss name is accepted.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Callable

from torch import Tensor

from lmpo.algos.registry import Registry

# parameters every preference loss has; the rest are the loss's own options
COMMON = ("chosen_logps", "rejected_logps", "ref_chosen_logps", "ref_rejected_logps", "beta",
          "chosen_lengths", "rejected_lengths")


def is_mix(spec: object) -> bool:
    """True for a weighted-sum spec (it has ``=`` or ``,``), False for a plain name."""
    return isinstance(spec, str) and ("=" in spec or "," in spec)


def parse_loss_weights(spec: str, registry: Registry) -> list[tuple[str, float]]:
    """``"dpo=0.8,bco_pair=0.2"`` -> ``[("dpo", 0.8), ("bco_pair", 0.2)]``; ValueError naming
    what is wrong: an empty part, an unknown loss, a repeated loss, a weight that is not a finite
    number > 0."""
    parts = []
    for item in spec.split(","):
        name, sep, weight_text = (s.strip() for s in item.partition("="))
        if not name:
            raise ValueError(f"loss {spec!r}: empty part {item!r}; write name=weight,name=weight")
        if name not in registry:
            raise ValueError(f"loss {spec!r}: unknown {registry.kind} {name!r}; choose from: "
                             f"{', '.join(registry.names())}")
        if any(name == seen for seen, _ in parts):
            raise ValueError(f"loss {spec!r}: {name!r} is given twice")
        try:
            weight = float(weight_text) if sep else 1.0
        except ValueError:
            raise ValueError(f"loss {spec!r}: the weight of {name!r} is not a number: {weight_text!r}") from None
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"loss {spec!r}: the weight of {name!r} must be a finite number > 0, got {weight_text!r}")
        parts.append((name, weight))
    return parts


def _options(fn: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    return {name: p for name, p in inspect.signature(fn).parameters.items() if name not in COMMON}


def weighted_loss(parts: list[tuple[str, float, Callable[..., Any]]]) -> Callable[..., Any]:
    """The loss ``sum_k w_k * fn_k(...)`` of ``(name, weight, fn)`` parts, per pair [B].

    It takes the union of the parts' options (each part receives those it reads) and raises
    TypeError for any other, as a single loss does. Figures: those of the first part, plus
    ``loss_<name>`` (each part's unweighted per-pair loss, detached). ``reference_free`` when
    every part is.
    """
    options: dict[str, inspect.Parameter] = {}
    for _, _, fn in parts:
        for name, param in _options(fn).items():
            options.setdefault(name, param)
    reads = [(name, weight, fn, set(_options(fn))) for name, weight, fn in parts]

    def mixed(chosen_logps: Tensor, rejected_logps: Tensor, ref_chosen_logps: Tensor | None,
              ref_rejected_logps: Tensor | None, *, beta: float = 0.1, chosen_lengths: Tensor | None = None,
              rejected_lengths: Tensor | None = None, **given: Any) -> tuple[Tensor, dict[str, Tensor]]:
        unknown = sorted(set(given) - set(options))
        if unknown:
            raise TypeError(f"weighted preference loss got unexpected options {unknown}")
        total, figures = None, {}
        for name, weight, fn, own in reads:
            loss, figs = fn(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta=beta,
                            chosen_lengths=chosen_lengths, rejected_lengths=rejected_lengths,
                            **{k: v for k, v in given.items() if k in own})
            total = weight * loss if total is None else total + weight * loss
            if not figures:
                figures = dict(figs)
            figures[f"loss_{name}"] = loss.detach()
        return total, figures

    base = [p for name, p in inspect.signature(mixed).parameters.items() if name != "given"]
    mixed.__signature__ = inspect.Signature(base + list(options.values()))
    mixed.__name__ = mixed.__qualname__ = "+".join(f"{w:g}*{name}" for name, w, _ in parts)
    mixed.__doc__ = f"Weighted sum of preference losses: {mixed.__name__} (see `weighted_loss`)."
    mixed.reference_free = all(getattr(fn, "reference_free", False) for _, _, fn in parts)
    mixed.parts = [(name, weight) for name, weight, _ in parts]
    return mixed


class PreferenceLossRegistry(Registry):
    """A `Registry` of preference losses whose `get` also accepts a weighted-sum spec
    (``"dpo=0.8,bco_pair=0.2"``, see `parse_loss_weights`); ``spec in registry`` is True for a
    valid one. `names` lists the single losses."""

    def get(self, name: str) -> Callable[..., Any]:
        if is_mix(name):
            return weighted_loss([(n, w, super(PreferenceLossRegistry, self).get(n))
                                  for n, w in parse_loss_weights(name, self)])
        return super().get(name)

    def __contains__(self, name: object) -> bool:
        if is_mix(name):
            try:
                self.get(name)
            except ValueError:
                return False
            return True
        return super().__contains__(name)
