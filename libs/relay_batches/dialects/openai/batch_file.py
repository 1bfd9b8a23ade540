"""The lines of an OpenAI Batch input file, ``{custom_id, method, url, body}``, and the
chat request (the stored row's vocabulary, :mod:`relay_batches.dialects.chat`) each
carries: its ``body``, less the fields left at the value that changes nothing. A line's
``url`` is any endpoint Relay runs; a body of another endpoint than chat is checked by
that endpoint's model (:mod:`relay_batches.dialects.endpoints`), not here.

What OpenAI allows but Relay cannot honour is refused naming the field, never dropped:
``n`` above 1, ``stream``, ``logprobs``, penalties, ... A field left at the value that
means "off" (``n: 1``, ``stream: false``) changes nothing and is accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from relay_batches.dialects.endpoints import ALL_ENDPOINTS, CHAT

URL = CHAT  # the endpoint of a chat line (every line of a file names the same one)
LINE_FIELDS = ("body", "custom_id", "method", "url")
# Body fields Relay cannot honour: the value that changes nothing, and why not.
OFF: dict[str, tuple[object, str]] = {
    "n": (1, "must be 1: Relay runs one completion per row"),
    "stream": (False, "must be false: batch rows are not streamed"),
    "logprobs": (False, "must be false: Relay does not return log probabilities"),
    "parallel_tool_calls": (True, "must be true: Relay cannot turn off parallel tool calls"),
    "store": (False, "must be false: Relay does not store completions at the provider"),
}
REFUSED = {
    key: "is not supported by Relay (its providers cannot all honour it)"
    for key in (
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "metadata",
        "modalities",
        "prediction",
        "presence_penalty",
        "reasoning_effort",
        "service_tier",
        "stream_options",
        "top_logprobs",
        "user",
        "web_search_options",
    )
}


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


def chat_request(
    body: Mapping[str, object],
) -> tuple[dict[str, Any], tuple[str, str] | None]:
    """The chat request of a line's ``body`` and, when a field cannot be honoured, the
    first such ``(body.<field>, why)``."""
    chat: dict[str, Any] = {}
    for key, value in body.items():
        if key in OFF:
            off, reason = OFF[key]
            if value is not None and (type(value) is not type(off) or value != off):
                return chat, (f"body.{key}", reason)
        elif key in REFUSED:
            return chat, (f"body.{key}", REFUSED[key])
        else:
            chat[key] = value
    return chat, None
