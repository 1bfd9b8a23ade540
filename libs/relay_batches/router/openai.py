"""The OpenAI-compatible chat completions provider (OpenAI, vLLM, Ollama, Together, …)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from relay_batches.router.aliases import Deployment
from relay_batches.router.types import ProviderReply, reply_with_usage


def build_request(
    deployment: Deployment, messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any]
) -> tuple[str, dict[str, str], bytes]:
    """URL, headers and body of one chat completions call."""
    headers = {"Content-Type": "application/json", **deployment.headers}
    if deployment.api_key:
        headers["Authorization"] = f"Bearer {deployment.api_key}"
    body = {**deployment.params, **params, "model": deployment.model, "messages": messages}
    return f"{deployment.base_url}/chat/completions", headers, orjson.dumps(body)


def parse_reply(raw: bytes) -> ProviderReply:
    """Content and usage of a 200 reply; a malformed one is a permanent failure."""
    try:
        data = orjson.loads(raw)
        choice = data["choices"][0]
        message = choice["message"]
        content = message.get("content")
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
        return ProviderReply(error="malformed response from upstream")
    if not isinstance(content, str):
        content = "" if content is None else orjson.dumps(content).decode()
    tool_calls = message.get("tool_calls")
    finish_reason = choice.get("finish_reason")
    return reply_with_usage(
        content,
        data.get("usage"),
        "prompt_tokens",
        "completion_tokens",
        tool_calls=tool_calls if isinstance(tool_calls, list) else None,
        finish_reason=finish_reason if isinstance(finish_reason, str) else None,
        model=data.get("model"),
    )
