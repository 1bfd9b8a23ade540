"""The OpenAI-compatible chat completions provider (OpenAI, vLLM, Ollama, Together, …).

A row already is a chat-completions request, so it is sent whole: its messages as they
are stored (content parts, ``name``, ``tool_calls``, ``tool`` turns) and every field it
carries (``tools``, ``tool_choice``, ``response_format``, ``max_tokens`` and
``max_completion_tokens`` as given, ``seed``, …) over the deployment's ``params``; only
``model`` is the deployment's. A row that sets either token limit replaces the
deployment's default limit of either name, so the two never reach the upstream together
unless the row itself sends both.

Reply: the first choice's content, its ``tool_calls`` (held to the well-formed shape),
the finish reason and usage. A reply that carries more than those hold — several choices
(``n`` above 1), a choice's ``logprobs``, a message's ``audio`` or ``annotations`` — is
kept whole besides (``Completion.body``), so the OpenAI output line shows the provider's
body, every choice included. A refusal (``content`` null, ``refusal`` text) is stored as
the content with finish reason ``content_filter``, so the surfaces show the text the
model gave (the outcome has no refusal field of its own).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from relay_batches.ratelimit.estimate import completion_cap
from relay_batches.router.aliases import Deployment
from relay_batches.router.types import ProviderReply, reply_with_usage
from relay_batches.tool_calls import FINISH_REASONS, checked_tool_calls

TOKEN_LIMITS = ("max_tokens", "max_completion_tokens")


def build_request(
    deployment: Deployment, messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any]
) -> tuple[str, dict[str, str], bytes]:
    """URL, headers and body of one chat completions call."""
    headers = {"Content-Type": "application/json", **deployment.headers}
    if deployment.api_key:
        headers["Authorization"] = f"Bearer {deployment.api_key}"
    defaults = deployment.params
    if defaults and any(params.get(key) is not None for key in TOKEN_LIMITS):
        defaults = {k: v for k, v in defaults.items() if k not in TOKEN_LIMITS}
    body = {**defaults, **params, "model": deployment.model, "messages": messages}
    if deployment.service_tier is not None:  # the flex lane: every call asks for it
        body["service_tier"] = deployment.service_tier
    return f"{deployment.base_url}/chat/completions", headers, orjson.dumps(body)


def token_cap(deployment: Deployment, params: Mapping[str, Any]) -> int:
    """The completion-token cap a call sends (what a tokens-per-minute limit counts):
    the row's when it gives one, else the deployment's; the larger of the two keys
    when both are sent; 0 for none; times ``n`` (each choice has the cap)."""
    source = params if any(params.get(key) is not None for key in TOKEN_LIMITS) else None
    source = deployment.params if source is None else source
    cap = max(completion_cap({key: source.get(key)}) for key in TOKEN_LIMITS)
    choices = params.get("n", deployment.params.get("n"))
    return cap * choices if type(choices) is int and choices > 1 else cap


# Message fields the outcome holds (any other non-empty one keeps the reply whole).
_KEPT_MESSAGE_FIELDS = frozenset({"role", "content", "refusal", "tool_calls"})


def _whole(data: Mapping[str, Any]) -> str | None:
    """The reply as compact JSON when it carries what the outcome's fields cannot hold:
    several choices, log probabilities, or a message field beyond content and tool
    calls (audio, annotations); None otherwise."""
    choices = data.get("choices")
    if not isinstance(choices, list):
        return None
    rich = len(choices) != 1 or any(
        isinstance(choice, dict)
        and (
            choice.get("logprobs") is not None
            or any(
                value not in (None, [], {}) and key not in _KEPT_MESSAGE_FIELDS
                for key, value in (choice.get("message") or {}).items()
            )
        )
        for choice in choices
    )
    return orjson.dumps(data).decode() if rich else None


def parse_reply(raw: bytes) -> ProviderReply:
    """Content, tool calls, finish reason and usage of a 200 reply; a malformed one
    (``tool_calls`` included: every entry must be a well-formed function call, see
    :mod:`relay_batches.tool_calls`) is a permanent failure. A refusal (``content``
    null, ``refusal`` text) is kept as the content with finish reason
    ``content_filter``. A finish reason outside the chat vocabulary is dropped."""
    try:
        data = orjson.loads(raw)
        choice = data["choices"][0]
        message = choice["message"]
        content = message.get("content")
        tool_calls = checked_tool_calls(message.get("tool_calls"))
        finish_reason = choice.get("finish_reason")
        refusal = message.get("refusal")
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
        return ProviderReply(error="malformed response from upstream")
    if tool_calls is None:
        return ProviderReply(error="malformed response from upstream")
    if content is None and isinstance(refusal, str):
        content, finish_reason = refusal, "content_filter"
    if not isinstance(content, str):
        content = "" if content is None else orjson.dumps(content).decode()
    return reply_with_usage(
        content,
        data.get("usage"),
        "prompt_tokens",
        "completion_tokens",
        tool_calls=tool_calls,
        finish_reason=finish_reason if finish_reason in FINISH_REASONS else None,
        model=data.get("model"),
        body=_whole(data),
    )
