"""The chat-completions ``tool_calls`` array: checking one a provider sent and reading
one the ledger stored.

A well-formed call is ``{"id": str, "type": "function", "function": {"name": str,
"arguments": str}}`` (other keys of the call are dropped). Providers' replies are held to
that exactly (:func:`checked_tool_calls`). Stored calls are read leniently
(:func:`stored_tool_calls`) because rows recorded before replies were checked may hold
anything: an entry that is not a well-formed call is left out, and ``arguments`` that are
JSON but not a string are kept as their JSON text, so a renderer never fails on them.
"""

from __future__ import annotations

from typing import Any

import orjson

FINISH_REASONS = frozenset({"stop", "length", "tool_calls", "content_filter"})


def _call(entry: Any, lenient: bool) -> dict[str, Any] | None:
    """The call ``entry`` in its canonical form, or None when it is not one."""
    if not isinstance(entry, dict) or entry.get("type") != "function":
        return None
    function = entry.get("function")
    if not isinstance(function, dict):
        return None
    call_id, name, arguments = entry.get("id"), function.get("name"), function.get("arguments")
    if not isinstance(call_id, str) or not isinstance(name, str):
        return None
    if not isinstance(arguments, str):
        if not lenient or arguments is None:
            return None
        arguments = orjson.dumps(arguments).decode()
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def checked_tool_calls(value: Any) -> list[dict[str, Any]] | None:
    """A reply's ``tool_calls`` in canonical form (``[]`` for null or none); None when
    it is not a list of well-formed calls, which makes the reply malformed."""
    if value is None:
        return []
    if not isinstance(value, list):
        return None
    calls = [_call(entry, lenient=False) for entry in value]
    return None if any(call is None for call in calls) else [c for c in calls if c is not None]


def stored_tool_calls(text: str | None) -> list[dict[str, Any]]:
    """The well-formed calls in a stored ``tool_calls`` JSON text (``[]`` for none,
    for text that is not JSON and for JSON that is not an array)."""
    if not text:
        return []
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return []
    if not isinstance(value, list):
        return []
    calls = (_call(entry, lenient=True) for entry in value)
    return [call for call in calls if call is not None]


def stored_finish_reason(value: str | None) -> str | None:
    """A stored finish reason when it is one of :data:`FINISH_REASONS`, else None."""
    return value if value in FINISH_REASONS else None
