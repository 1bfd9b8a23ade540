"""The envelope every bus message shares: a JSON object with the schema version
(``v``) and its ``kind``, encoded and decoded with orjson; a body that is not one raises
:class:`MessageError`."""

from __future__ import annotations

from typing import Any

import orjson

SCHEMA_VERSION = 1


class MessageError(ValueError):
    """A message body that is not a valid message of the expected kind."""


def load(body: bytes, kind: str) -> dict[str, Any]:
    """The payload of a ``kind`` message; :class:`MessageError` if ``body`` is not one."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MessageError(f"{kind}: body is not JSON") from exc
    if not isinstance(data, dict):
        raise MessageError(f"{kind}: body is not an object")
    if data.get("v") != SCHEMA_VERSION:
        raise MessageError(f"{kind}: unsupported schema version {data.get('v')!r}")
    if data.get("kind") != kind:
        raise MessageError(f"expected {kind}, got {data.get('kind')!r}")
    return data


def dump(kind: str, payload: dict[str, Any]) -> bytes:
    """A ``kind`` message's body with ``payload``."""
    return orjson.dumps({"v": SCHEMA_VERSION, "kind": kind, **payload})
