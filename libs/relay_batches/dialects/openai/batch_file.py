"""The lines of an OpenAI Batch input file, ``{custom_id, method, url, body}``, and the
chat request (the stored row's vocabulary, :mod:`relay_batches.dialects.chat`) each
carries: its ``body``, as it came. A line's ``url`` is any endpoint Relay runs; a body
of another endpoint than chat is checked by that endpoint's model
(:mod:`relay_batches.dialects.endpoints`), not here.

Every field of the chat-completions request is accepted by the row model
(:mod:`relay_batches.dialects.chat_params`); what one deployment cannot honour fails that
row on that deployment (naming the field), never the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from relay_batches.dialects.endpoints import ALL_ENDPOINTS, CHAT

URL = CHAT  # the endpoint of a chat line (every line of a file names the same one)
LINE_FIELDS = ("body", "custom_id", "method", "url")


def unknown_field(line: Mapping[Any, object]) -> str | None:
    """The first key of ``line`` that is not a field of a batch line, None if none."""
    return next((str(key) for key in line if key not in LINE_FIELDS), None)


def target_problem(line: Mapping[str, object]) -> tuple[str, str] | None:
    """``(field, message)`` unless ``line`` POSTs a ``body`` to an endpoint Relay runs
    (:data:`~relay_batches.dialects.endpoints.ALL_ENDPOINTS`)."""
    if line.get("method") != "POST":
        return "method", "must be POST"
    if line.get("url") not in ALL_ENDPOINTS:
        return "url", f"must be one of {', '.join(ALL_ENDPOINTS)} (the endpoints Relay runs)"
    body = line.get("body")
    if type(body) is not dict:
        return "body", "is required" if body is None else "must be an object"
    return None


def chat_request(body: Mapping[str, object]) -> dict[str, Any]:
    """The chat request of a line's ``body``: the body itself (the row model checks it)."""
    return dict(body)
