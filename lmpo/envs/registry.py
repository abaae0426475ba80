"""Tasks by spec (see `lmpo.envs.plugins` and docs/tasks.md): a built-in name with options
(`sort_digits` or `sort_digits:length=6,flaw_rate=0.5`), an installed plugin (entry-point group
`lmpo.tasks`), `module:Class` or `path/to/file.py:Class`, options after `?`
(`my_tasks:Reverse?length=4`). `exact_match` grades users' prompt files against their answer column."""

from __future__ import annotations

from typing import Callable

from lmpo.envs.aftersales import Aftersales
from lmpo.envs.base import Task, limit_problems
from lmpo.envs.digit_tasks import CountDigit, Increment, ReverseDigits
from lmpo.envs.exact_match import ExactMatch
from lmpo.envs.plugins import bind_options, installed_tasks, load_target, parse_spec
from lmpo.envs.sort_digits import SortDigits
from lmpo.envs.tool_tasks import Calculator, Vault

TASKS: dict[str, Callable[..., Task]] = {"sort_digits": SortDigits, "exact_match": ExactMatch, "vault": Vault,
                                         "calculator": Calculator, "reverse_digits": ReverseDigits,
                                         "increment": Increment, "aftersales": Aftersales,
                                         "count_digit": CountDigit}

REQUIRED = ("grade", "is_heldout")


def is_named(name: str) -> bool:
    """A built-in task, or an installed one (the entry points are only read when needed)."""
    return name in TASKS or (name.isidentifier() and name in installed_tasks())


def make_task(spec: str) -> Task:
    """The task a spec names, built with the spec's options (see this module's docstring for the
    forms); a ValueError says what is wrong with a spec, its options, or a task lacking
    ``grade`` / ``is_heldout``, or episode limits that cannot work (`limit_problems`)."""
    parsed = parse_spec(spec, is_named)
    factory = load_target(parsed.target, TASKS)
    options = bind_options(factory, parsed)
    try:
        task = factory(**options)
    except TypeError as err:
        raise ValueError(f"bad options for task {parsed.target!r}: {err}") from None
    missing = [m for m in REQUIRED if not callable(getattr(task, m, None))]
    if missing:
        raise ValueError(f"task {parsed.target!r} gave a {type(task).__name__}, which lacks "
                         f"{', '.join(missing)}: a task follows the protocol in lmpo/envs/base.py")
    if problems := limit_problems(task):
        raise ValueError(f"{described(task, parsed.target)}: {'; '.join(problems)}")
    try:
        task.spec = spec.strip()  # what the user wrote: a suggestion can add an option to it
    except AttributeError:
        pass
    if not isinstance(getattr(task, "name", None), str):
        try:
            task.name = parsed.target.rpartition(":")[2] or parsed.target
        except AttributeError:
            pass
    return task


def described(task, target: str) -> str:
    """How a message names a task: its class and where it came from (`task WordLen (my_tasks.py)`),
    or the name it was given by (`task 'calculator'`)."""
    where, colon, _ = target.rpartition(":")
    return f"task {type(task).__name__} ({where})" if colon else f"task {target!r}"
