"""Task specs: which task a `--task` value names, and its options.

A spec is one of

- a built-in name, `sort_digits`, with options after a colon (`sort_digits:length=6,flaw_rate=0.5`)
  or after a question mark (`sort_digits?length=6`);
- an installed plugin's name from the `lmpo.tasks` entry-point group, options the same way;
- `module:Class` (imported from the module path, the current directory first) or
  `path/to/file.py:Class` (loaded from that file), options after a question mark only:
  `my_tasks:Reverse?length=4,name=short`. The colon already separates module and class, so a
  plugin's options cannot follow a colon.

Option values are read as the task's parameters declare them (`int`, `float`, `bool`: `true`,
`false`, 1 or 0; `str`: the text as written); without a declared type, as int, float,
`true`/`false`, or else kept as strings. An option the task does not take is refused with the
options it does take. `Class` may be any callable returning a task (a class or a factory function).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
import traceback
import types
import typing
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Callable

from lmpo.names import did_you_mean

ENTRY_POINT_GROUP = "lmpo.tasks"
HOW_TO_PLUG_IN = ("plug your own in with --task path/to/file.py:Class or --task module:Class "
                  "(options: 'module:Class?key=value,key=value'), or install a package that declares it "
                  f"under the {ENTRY_POINT_GROUP!r} entry-point group; see docs/tasks.md")


@dataclass(frozen=True)
class TaskSpec:
    """A parsed `--task` value: `target` names the task, `options` are its keyword arguments."""

    target: str
    options: dict[str, Any] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    """Each option's value as written, for a parameter declared `str` (`007` stays `007`)."""

    @property
    def is_import_path(self) -> bool:
        return ":" in self.target


def parse_value(text: str) -> Any:
    value = text.strip()
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def parse_options(text: str, spec: str) -> dict[str, str]:
    """The options of a spec as written: key -> value text."""
    options: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"task option {item!r} in {spec!r} must look like key=value")
        if key.strip() in options:  # the last would win, silently
            raise ValueError(f"task option {key.strip()!r} is given twice in {spec!r}; keep one")
        options[key.strip()] = value.strip()
    return options


def parse_spec(spec: str, named: Callable[[str], bool]) -> TaskSpec:
    """Split `spec` into target and options; `named(name)` says whether a name is registered
    (built in or installed), for which a colon introduces options rather than a class."""
    spec = spec.strip()
    target, question, query = spec.partition("?")
    if not question:
        name, colon, legacy = target.partition(":")
        if colon and named(name):
            target, query = name, legacy
    texts = parse_options(query, spec)
    return TaskSpec(target.strip(), {key: parse_value(text) for key, text in texts.items()}, texts)


def spec_with_option(spec: str, option: str, named: Callable[[str], bool]) -> str:
    """`spec` with `option` (`key=value`) added to its options, in the form `parse_spec` reads."""
    spec = spec.strip()
    target, question, query = spec.partition("?")
    if not question:
        name, colon, legacy = target.partition(":")
        if colon and named(name):
            return f"{spec},{option}" if legacy.strip() else f"{name}:{option}"
        return f"{spec}:{option}" if named(spec) else f"{spec}?{option}"
    return f"{spec},{option}" if query.strip() else f"{target}?{option}"


def bind_options(factory: Callable, spec: TaskSpec) -> dict[str, Any]:
    """`spec`'s options as `factory`'s keyword arguments, each read as its parameter's declared
    type; an option the factory does not take, or a value not of its type, is refused naming it."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a callable without a signature: pass the options as read
        return dict(spec.options)
    try:
        hints = typing.get_type_hints(factory.__init__ if isinstance(factory, type) else factory)
    except Exception:  # annotations that do not resolve: no declared types
        hints = {}
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    named = [n for n, p in parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    bound = {}
    for key, value in spec.options.items():
        if key not in named and not takes_any:
            close = difflib.get_close_matches(key, named, n=1)
            raise ValueError(f"task {spec.target!r} has no option {key!r}"
                             f"{f' (did you mean {close[0]!r}?)' if close else ''}; "
                             f"its options: {', '.join(named) or 'none'}")
        bound[key] = _as_declared(hints.get(key), value, spec.texts.get(key, str(value)), key, spec.target)
    return bound


def _as_declared(hint: Any, value: Any, text: str, key: str, target: str) -> Any:
    kinds = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if str in kinds:
        return text
    if bool in kinds:
        if isinstance(value, bool) or value in (0, 1):
            return bool(value)
        expected = "true or false (or 1 / 0)"
    elif int in kinds:
        if isinstance(value, int):
            return int(value)
        expected = "an integer"
    elif float in kinds:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value  # an int stands for a float, as it would in Python
        expected = "a number"
    else:  # undeclared, or a type options cannot spell: as read
        return value
    raise ValueError(f"task {target!r}: option {key!r} expects {expected}, got {text!r}")


def installed_tasks() -> dict[str, Any]:
    """Entry points of the `lmpo.tasks` group, by name (loaded only when used)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def load_target(target: str, builtins: dict[str, Callable]) -> Callable:
    """The callable a spec's target names: built in, installed, `module:Class` or `file.py:Class`."""
    if target in builtins:
        clash = installed_tasks().get(target) if target.isidentifier() else None
        if clash is not None:  # either choice would silently run a task the user did not mean
            raise ValueError(f"task {target!r} is both a built-in task and the installed entry point "
                             f"{clash.value!r} (group {ENTRY_POINT_GROUP!r}); give the installed one another "
                             f"name, or name it by its path: --task {clash.value}")
        return builtins[target]
    if ":" in target:
        where, _, attr = target.rpartition(":")
        module = load_file(where, target) if _looks_like_file(where) else _import_module(where, target)
        return _attribute(module, attr, target)
    installed = installed_tasks()
    if target in installed:
        try:
            return installed[target].load()
        except Exception as err:
            raise ValueError(f"task {target!r} (entry point {installed[target].value!r} of group "
                             f"{ENTRY_POINT_GROUP!r}) failed to load: {_failure(err)}") from err
    raise ValueError(unknown_task_message(target, builtins, installed))


def unknown_task_message(target: str, builtins: dict, installed: dict) -> str:
    names = ", ".join(builtins) + (f"; installed: {', '.join(installed)}" if installed else "")
    hint = ""
    head, dot, tail = target.rpartition(".")
    if dot and head and tail[:1].isupper():
        hint = f" (did you mean {head + ':' + tail!r}? module and class are separated by a colon)"
    else:
        hint = did_you_mean(target, [*builtins, *installed])
    return f"unknown task {target!r}{hint}; choose one of: {names}; or {HOW_TO_PLUG_IN}"


def _looks_like_file(where: str) -> bool:
    return where.endswith(".py") or "/" in where or "\\" in where


def on_module_path(*directories: str | Path) -> None:
    """Put `directories` at the front of sys.path, the first one first, unless already there.
    The installed `lmpo` script's sys.path starts with the script's directory, not the current
    one as `python -m lmpo`'s does; the reward workers get this process's sys.path."""
    for directory in reversed(directories):
        directory = str(Path(directory).resolve())
        if directory not in sys.path and not (directory == os.getcwd() and ("" in sys.path or "." in sys.path)):
            sys.path.insert(0, directory)


def _import_module(name: str, target: str):
    on_module_path(os.getcwd())
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name and name.startswith(err.name):
            raise ValueError(f"task {target!r}: no module named {name!r} on the module path (the current "
                             f"directory, then PYTHONPATH); for a file use --task path/to/{name}.py:Class") from None
        raise ValueError(f"task {target!r}: importing {name!r} failed: {_failure(err)}") from err
    except Exception as err:
        raise ValueError(f"task {target!r}: importing {name!r} failed: {_failure(err)}") from err


def load_file(where: str, target: str, what: str = "task"):
    """The module of a `path/to/file.py` a task (or a reward function, `what`) is taken from."""
    path = Path(where).expanduser().resolve()
    if path.is_dir():  # "does not exist" sent the user looking for a file that is there
        raise ValueError(f"{what} {target!r}: {where} is a directory; give the Python file in it that defines "
                         f"the {what}")
    if not path.is_file():
        raise ValueError(f"{what} {target!r}: file {where} does not exist (relative paths start at the "
                         f"current directory, {Path.cwd()})")
    # one module per file: every make_task call of a run gets the same class
    name = f"lmpo_task_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    # as `python path/to/file.py` would: a helper module beside the file imports, and so does one
    # in the current directory (as for a `module:Class` spec)
    on_module_path(path.parent, os.getcwd())
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[name]
        raise ValueError(f"{what} {target!r}: loading {path} failed: {_failure(err)}") from err
    loaded = [p for p in os.environ.get(TASK_FILES_ENV, "").split(os.pathsep) if p]
    if str(path) not in loaded:  # inherited by the reward workers, which unpickle this module's classes
        os.environ[TASK_FILES_ENV] = os.pathsep.join([*loaded, str(path)])
    return module


TASK_FILES_ENV = "LMPO_TASK_FILES"
"""The files this process loaded tasks or reward functions from (`--task path/to/file.py:Class`,
`--rewards path/to/file.py:fn=1`), for its child processes."""


def load_task_files() -> None:
    """In a reward worker: the task files its trainer loaded, under the same module names, so a
    task from a file unpickles there (it failed with `No module named 'lmpo_task_...'`)."""
    for path in filter(None, os.environ.get(TASK_FILES_ENV, "").split(os.pathsep)):
        load_file(path, path)


def _attribute(module, attr: str, target: str) -> Callable:
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            defined = sorted(n for n, v in vars(module).items() if isinstance(v, type) and not n.startswith("_")
                             and getattr(v, "__module__", "") == module.__name__)
            raise ValueError(f"task {target!r}: {module.__name__ if not hasattr(module, '__file__') else module.__file__} "
                             f"has no {attr!r}; classes defined there: {', '.join(defined) or 'none'}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"task {target!r}: {attr!r} is a {type(obj).__name__}, not a class or function")
    return obj


def _failure(err: BaseException) -> str:
    """`Type: message (file:line)` of the innermost frame, for a one-line error."""
    frames = traceback.extract_tb(err.__traceback__)
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    if isinstance(err, SyntaxError) and err.filename:
        where = f" ({err.filename}:{err.lineno})"
    return f"{type(err).__name__}: {err}{where}"
