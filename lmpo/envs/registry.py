"""Tasks by name, with options: `sort_digits` or `sort_digits:length=6,flaw_rate=0.5`;
`exact_match` grades users' prompt files against their answer column."""

from __future__ import annotations

from typing import Callable

from lmpo.envs.aftersales import Aftersales
from lmpo.envs.base import Task
from lmpo.envs.exact_match import ExactMatch
from lmpo.envs.sort_digits import SortDigits
from lmpo.envs.tool_tasks import Calculator, Vault

TASKS: dict[str, Callable[..., Task]] = {"sort_digits": SortDigits, "exact_match": ExactMatch, "vault": Vault,
                                         "calculator": Calculator, "aftersales": Aftersales}


def make_task(spec: str) -> Task:
    name, _, options = spec.partition(":")
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of: {', '.join(TASKS)}")
    kwargs: dict[str, float | int] = {}
    for item in filter(None, options.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"task option {item!r} in {spec!r} must look like key=value")
        try:
            kwargs[key.strip()] = int(value) if value.strip().lstrip("-").isdigit() else float(value)
        except ValueError:
            raise ValueError(f"task option {key!r} in {spec!r} must be a number, got {value!r}") from None
    try:
        return TASKS[name](**kwargs)
    except TypeError as err:
        raise ValueError(f"bad options for task {name!r}: {err}") from None
