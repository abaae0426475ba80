"""An error's words by key. A lower layer raises its English text as it always did, with the key
and the fields it was filled from (`keyed(err, key, **fields)`), so that a command answering in
another language says it in that language (`lmpo.teach.refusals.said`) without the lower layer
knowing any language but English. Like `lmpo.names`, it imports nothing: every layer may use it."""

from __future__ import annotations

from typing import Any, TypeVar

E = TypeVar("E", bound=BaseException)


def keyed(err: E, key: str, **fields: Any) -> E:
    """`err`, marked as the text `key` filled from `fields`."""
    err.text_key, err.text_fields = key, fields  # type: ignore[attr-defined]
    return err


def key_of(err: BaseException) -> tuple[str, dict[str, Any]] | None:
    """(key, fields) of an error raised through `keyed`; None for any other."""
    key = getattr(err, "text_key", None)
    return (key, getattr(err, "text_fields", {})) if key else None
