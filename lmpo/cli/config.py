"""Typed configs from dataclasses: defaults < preset < YAML file < command-line flags.

Flags and their help come from the dataclass itself: a field's type hint gives the parser,
the docstring under the field gives the help text (CleanRL style). Nested dataclass fields
become sections (`cpt:` in YAML, `--cpt.steps` on the command line). An unknown or ill-typed
key is an error that names it, with the file and line for YAML.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import re
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Callable, Literal

import yaml

from lmpo.cli.parser import suggestion


class ConfigError(ValueError):
    pass


FILE_PATHS: dict[str, str] = {}
"""Path-like values a --config file gave ({value: "FILE: line N: key"}): an error that names one
later (`model directory ../m_llama does not exist`) says where it came from (`from_config_file`)."""


def from_config_file(message: str) -> str:
    """`message`, with where the first path it names came from, when a --config file gave it."""
    for value, where in FILE_PATHS.items():
        if re.search(rf"(?<![\w./-]){re.escape(value)}(?![\w./-])", message):
            relative = "" if Path(value).is_absolute() else f"; read from the current directory, {Path.cwd()}"
            return f"{message} ({value}: from {where}{relative})"
    return message


def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of a dataclass (and of its bases)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def coerce(hint: Any, value: Any, where: str) -> Any:
    """Check/convert `value` to the field type `hint`; strings (from flags) are parsed."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        return coerce(args[0], value, where)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            raise ConfigError(f"{where}: expected one of {', '.join(map(str, choices))}, got {_shown(value)}")
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
            return value.lower() in ("true", "1", "yes", "on")
        raise ConfigError(f"{where}: expected true or false, got {_shown(value)}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected an integer, got {_shown(value)}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected a number, got {_shown(value)}")
    if hint is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, (dict, list)):  # YAML's mapping for an option that takes JSON (chat_template_kwargs)
            try:
                return json.dumps(value)
            except (TypeError, ValueError) as err:  # a date, a set, a list that contains itself
                raise ConfigError(f"{where}: cannot be given as JSON text ({err})") from None
        raise ConfigError(f"{where}: expected a string, got {_shown(value)}")
    raise ConfigError(f"{where}: unsupported field type {hint}")


def _shown(value: Any) -> str:
    """A value as the YAML file wrote it: `null`, `true` (not Python's None, True)."""
    if value is None:
        return "null (leave the option out for its default)"
    return json.dumps(value) if isinstance(value, bool) else repr(value)


def _flatten_fields(cls: type, prefix: str = "") -> dict[str, tuple[Any, str]]:
    """Dotted name → (type hint, help) for every leaf field, nested sections included."""
    out: dict[str, tuple[Any, str]] = {}
    docs, hints = field_docs(cls), _hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            out.update(_flatten_fields(hint, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = (hint, docs.get(f.name, ""))
    return out


def add_arguments(parser: argparse.ArgumentParser, cls: type, defaults: dict[str, Any] | None = None,
                  unlisted: Callable[[str], bool] = lambda name: False,
                  sources: dict[str, str] | None = None) -> None:
    """One `--flag` per field (nested as `--section.field`), help from the field docstring.
    `defaults`: the value shown for a flag where it is not the field's own default; `sources`: what
    set that value (said beside it). `unlisted(name)`: a flag kept out of `--help` (still parsed, so
    that its refusal can say why)."""
    parser.add_argument("--config", metavar="FILE", help="YAML (or JSON) file of option values (flags win over it)")
    current, said = defaults or {}, sources or {}
    for name, (hint, doc) in _flatten_fields(cls).items():
        kind = _type_name(hint)
        default = current.get(name, _default_of(cls, name))
        source = f", {said[name]}" if name in said else ""
        text = argparse.SUPPRESS if unlisted(name) else f"{doc} (default: {default!r}{source})".replace("%", "%%")
        parser.add_argument(f"--{name}", dest=name, metavar=kind, default=argparse.SUPPRESS, help=text)


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is Literal:
        return "{" + ",".join(map(str, typing.get_args(hint))) + "}"
    return getattr(hint, "__name__", str(hint)).upper()


def _default_of(cls: type, dotted: str) -> Any:
    obj: Any = cls()
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _yaml_problem(err: yaml.YAMLError) -> str:
    """One line: where in the file the parser gave up, and why."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None)
    if mark is None or not problem:
        return "not valid YAML: " + " ".join(str(err).split())
    context = getattr(err, "context", None)
    return f"line {mark.line + 1}, column {mark.column + 1}: not valid YAML: {problem}" + (f" ({context})" if context else "")


def read_yaml(path: str | Path) -> tuple[dict, dict[str, int]]:
    """The YAML mapping and the line number of each (dotted) key."""
    doc = _read_yaml(path)
    return doc.data, doc.lines


@dataclasses.dataclass
class _YamlDoc:
    data: dict
    """The mapping, values constructed as YAML's safe loader does."""
    lines: dict[str, int]
    """Dotted key → the line it is (first) given on."""
    text: dict[str, str]
    """Dotted key → the source text of a plain (unquoted) scalar value, as written: a text option
    takes it, so that `out: 2024_01` is not read as the integer 202401 (nor `1.10` as 1.1)."""
    again: dict[str, int]
    """Dotted key → the line of a second spelling of it (`cpt.steps:` and `steps:` under `cpt:`)."""


_NULL_TAG = "tag:yaml.org,2002:null"


def _not_utf8(err: UnicodeDecodeError) -> str:
    """Where a config file stops being UTF-8, and the byte there: "byte 0" said neither which byte
    nor that it was an offset (a UTF-16 file, as some Windows editors save, fails at its first)."""
    line = err.object[:err.start].count(b"\n") + 1
    utf16 = " (a UTF-16 byte-order mark: the file is UTF-16)" if err.object[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
    return (f"line {line}: not valid UTF-8: byte 0x{err.object[err.start]:02x} at offset {err.start}{utf16}; "
            f"a config file is UTF-8 text: save it as UTF-8")


def _read_yaml(path: str | Path) -> _YamlDoc:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {path} is a directory, not a file")
    if path.exists() and not path.is_file():  # /dev/null, a pipe: not a file of options
        kind = "a character device" if path.is_char_device() else "a pipe" if path.is_fifo() else "not a regular file"
        raise ConfigError(f"config file {path} is {kind}, not a YAML file of options" + (
            " (for no options from a file, leave --config out)" if path == Path("/dev/null") else ""))
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    if path.suffix.lower() == ".toml":  # read as YAML it is one long scalar: "expected a mapping" said nothing of why
        raise ConfigError(f"{path}: TOML is not supported; a config file is YAML (or JSON, which YAML reads): "
                          f"write `key = value` as `key: value`, and a [section] as `section:` with its options "
                          f"indented under it")
    try:
        node = yaml.compose(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: {_yaml_problem(err)}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: {_not_utf8(err)}") from None
    except OSError as err:
        raise ConfigError(f"config file {path}: cannot be read ({err.strerror or err})") from None
    doc = _YamlDoc({}, {}, {}, {})
    if node is None:
        return doc
    if not isinstance(node, yaml.MappingNode):
        toml = isinstance(node, yaml.ScalarNode) and "=" in str(node.value)
        hint = " (this reads as TOML's `key = value`; config files are YAML: `key: value`)" if toml else ""
        raise ConfigError(f"{path}: line {node.start_mark.line + 1}: expected a mapping of option: value{hint}")
    lines = doc.lines

    def walk(n: yaml.MappingNode, prefix: str, inside: tuple) -> dict:
        out = {}
        for key_node, value_node in n.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                kind = "list" if isinstance(key_node, yaml.SequenceNode) else "mapping"
                section = f"{prefix[:-1]}: " if prefix else ""
                raise ConfigError(f"{path}: line {line}: {section}a key must be an option name, not a {kind}")
            key = f"{prefix}{key_node.value}"
            if key_node.value in out:  # YAML would let the last one win, silently
                raise ConfigError(f"{path}: line {line}: {key}: given twice "
                                  f"(first on line {lines[key]}); keep one")
            if key in lines:  # `cpt.steps:` and `steps:` under `cpt:`; build() refuses it for an option
                doc.again.setdefault(key, line)
            else:
                lines[key] = line
            if isinstance(value_node, yaml.MappingNode):
                if any(value_node is m for m in inside):
                    raise ConfigError(f"{path}: line {line}: {key}: an alias to a mapping that contains it")
                out[key_node.value] = walk(value_node, f"{key}.", (*inside, value_node))
                continue
            try:
                out[key_node.value] = yaml.SafeLoader("").construct_object(value_node, deep=True)
            except yaml.YAMLError as err:  # a tag it does not know (`!custom`, `!!python/...`), an unhashable key
                mark = getattr(err, "problem_mark", None) or value_node.start_mark
                problem = getattr(err, "problem", None) or " ".join(str(err).split())
                hint = ("; config files take plain values (quote it to give text)"
                        if "constructor for the tag" in problem else "")
                raise ConfigError(f"{path}: line {mark.line + 1}, column {mark.column + 1}: {key}: "
                                  f"{problem}{hint}") from None
            if (isinstance(value_node, yaml.ScalarNode) and value_node.style is None
                    and value_node.tag != _NULL_TAG):
                doc.text[key] = value_node.value
        return out

    doc.data = walk(node, "", (node,))
    return doc


def build(cls: type, *, preset: dict[str, Any] | None = None, yaml_file: str | None = None,
          flags: dict[str, Any] | None = None) -> Any:
    """Construct `cls` from its defaults, a preset, a YAML file and flags, in that order."""
    leaves = _flatten_fields(cls)
    values: dict[str, Any] = dict(preset or {})
    if yaml_file:
        doc = _read_yaml(yaml_file)
        lines = doc.lines
        for key, value in _flatten_dict(doc.data, leaves).items():
            where = f"{yaml_file}: line {lines.get(key, '?')}: {key}"
            if key not in leaves:
                if any(name.startswith(f"{key}.") for name in leaves):
                    got = "it is empty" if value is None else f"got {value!r}"
                    raise ConfigError(f"{where}: a section, not an option: it must be a mapping of the "
                                      f"section's options (like `{key}: {{{_an_option(key, leaves)}: ...}}`); {got}")
                hint = suggestion(key, list(leaves))
                raise ConfigError(f"{where}: unknown option{f' ({hint})' if hint else ''}; valid options: "
                                  f"{', '.join(sorted(leaves))}")
            if key in doc.again:
                raise ConfigError(f"{yaml_file}: line {doc.again[key]}: {key}: given twice (first on line "
                                  f"{lines[key]}, once as a dotted key and once in its section); keep one")
            hint_type = leaves[key][0]
            if key in doc.text and _takes_text(hint_type, doc.text[key]):
                value = doc.text[key]  # the text as written: `out: 2024_01` is not the integer 202401
            values[key] = coerce(hint_type, value, where)
            if isinstance(values[key], str) and ("/" in values[key] or Path(values[key]).suffix):
                FILE_PATHS[values[key]] = where
    for key, value in (flags or {}).items():
        if key not in leaves:
            raise ConfigError(f"--{key}: unknown option")
        values[key] = coerce(leaves[key][0], value, f"--{key}")
    return _construct(cls, values, "")


def _takes_text(hint: Any, text: str) -> bool:
    """Whether an option of type `hint` takes a plain YAML scalar's source `text` as it is."""
    if hint is str:
        return True
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return len(args) == 1 and _takes_text(args[0], text)
    return typing.get_origin(hint) is Literal and text in typing.get_args(hint)


def _an_option(section: str, leaves: dict[str, Any]) -> str:
    """An option of `section`, for an example: its `lr` where it has one."""
    names = sorted(name[len(section) + 1:] for name in leaves if name.startswith(f"{section}."))
    return "lr" if "lr" in names else names[0]


def _flatten_dict(data: dict, leaves: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys of a nested mapping; a mapping under an option (not a section) is its value."""
    out = {}
    for key, value in data.items():
        if isinstance(value, dict) and f"{prefix}{key}" not in leaves:
            out.update(_flatten_dict(value, leaves, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _construct(cls: type, values: dict[str, Any], prefix: str) -> Any:
    kwargs = {}
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            kwargs[f.name] = _construct(hints[f.name], values, f"{name}.")
        elif name in values:
            kwargs[f.name] = values[name]
    return cls(**kwargs)
