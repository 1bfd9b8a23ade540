"""The Anthropic Messages API provider (``POST {base_url}/messages``).

Translation from the chat shape: ``system`` and ``developer`` messages become the
top-level ``system`` text; ``stop`` becomes ``stop_sequences``; ``max_tokens`` is
required by the API, so it defaults to :data:`DEFAULT_MAX_TOKENS` (a deployment's
``params.max_tokens`` overrides it). ``seed`` and ``response_format`` have no
equivalent and are not sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from relay_batches.router.aliases import Deployment
from relay_batches.router.types import ProviderReply, reply_with_usage

API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 1024
SYSTEM_ROLES = frozenset({"system", "developer"})
PASSED_PARAMS = ("temperature", "top_p", "max_tokens")


def translate_body(
    deployment: Deployment, messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any]
) -> dict[str, Any]:
    """The Messages API body for chat ``messages`` and batch ``params``."""
    merged = {**deployment.params, **params}
    system = "\n\n".join(m["content"] for m in messages if m.get("role") in SYSTEM_ROLES)
    body: dict[str, Any] = {
        "model": deployment.model,
        "max_tokens": merged.get("max_tokens", DEFAULT_MAX_TOKENS),
        "messages": [
            {"role": m["role"], "content": m["content"]}
            for m in messages
            if m.get("role") not in SYSTEM_ROLES
        ],
    }
    if system:
        body["system"] = system
    for key in PASSED_PARAMS:
        if key in merged and key != "max_tokens":
            body[key] = merged[key]
    if "stop" in merged:
        stop = merged["stop"]
        body["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    return body


def build_request(
    deployment: Deployment, messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any]
) -> tuple[str, dict[str, str], bytes]:
    """URL, headers and body of one Messages call."""
    headers = {
        "Content-Type": "application/json",
        "anthropic-version": API_VERSION,
        **deployment.headers,
    }
    if deployment.api_key:
        headers["x-api-key"] = deployment.api_key
    body = translate_body(deployment, messages, params)
    return f"{deployment.base_url}/messages", headers, orjson.dumps(body)


# Messages stop reasons in the chat-completions vocabulary of outcomes.
FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    "pause_turn": "stop",
}


def parse_reply(raw: bytes) -> ProviderReply:
    """The reply's text blocks joined, its ``tool_use`` blocks as chat-completions tool
    calls, its stop reason as a finish reason, and its usage."""
    try:
        data = orjson.loads(raw)
        blocks = data["content"]
        text = "".join(b["text"] for b in blocks if isinstance(b, dict) and b.get("type") == "text")
        tool_calls = [
            {
                "id": b["id"],
                "type": "function",
                "function": {"name": b["name"], "arguments": orjson.dumps(b["input"]).decode()},
            }
            for b in blocks
            if isinstance(b, dict) and b.get("type") == "tool_use"
        ]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return ProviderReply(error="malformed response from upstream")
    stop_reason = data.get("stop_reason")
    return reply_with_usage(
        text,
        data.get("usage"),
        "input_tokens",
        "output_tokens",
        tool_calls=tool_calls,
        finish_reason=FINISH_REASONS.get(stop_reason) if isinstance(stop_reason, str) else None,
        model=data.get("model"),
    )
