"""A tiny name -> function registry, so that configs can pick algorithms by name."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from lmpo.names import did_you_mean

F = TypeVar("F", bound=Callable[..., Any])


class UnknownNameError(KeyError, ValueError):
    """Raised by `Registry.get` for an unregistered name.

    Subclasses both `KeyError` and `ValueError` so that either `except` clause catches it.
    """

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message, adding quotes around it.
        return str(self.args[0]) if self.args else ""


class Registry:
    """Maps names to callables of one kind (e.g. "advantage estimator")."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Callable[..., Any]] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator: `@REGISTRY.register("name")` registers the function under `name`."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def decorator(fn: F) -> F:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = fn
            return fn

        return decorator

    def unregister(self, name: str) -> Callable[..., Any]:
        """Remove `name` and return its function (to plug a user's function in for a while)."""
        self.get(name)  # the same error as `get` for an unknown name
        return self._entries.pop(name)

    def get(self, name: str) -> Callable[..., Any]:
        """The callable registered under `name`; `UnknownNameError` listing the valid names otherwise."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}{did_you_mean(str(name), self.names())}; "
                f"choose one of: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
