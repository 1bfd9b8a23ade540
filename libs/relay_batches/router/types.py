"""Small values the router passes around."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Completion:
    """A successful reply of a model, in the chat-completions vocabulary whatever the
    provider: ``content`` is the text (``""`` when the model only called tools),
    ``tool_calls`` the chat-completions ``tool_calls`` array (None for none),
    ``finish_reason`` one of stop, length, tool_calls, content_filter (None when the
    provider gave none), ``model`` the model that answered as the provider named it,
    ``body`` the provider's whole reply (compact JSON) when it carries more than these
    fields hold (several choices, log probabilities, audio, annotations), else None."""

    content: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None
    model: str | None = None
    body: str | None = None
    cached_tokens: int = 0  # of prompt_tokens: read from the provider's prompt cache


class UnsupportedRequest(ValueError):
    """A row asks for something a provider cannot honour (raised while building the
    request, before anything is sent): the router records it as a permanent failure of
    that deployment, so the row falls through to the alias's next deployment. The
    message names the field, e.g. ``anthropic deployments cannot take seed``."""


@dataclass(slots=True)
class ProviderReply:
    """A provider's parse of a 200 reply: a completion, or why it is unusable."""

    completion: Completion | None = None
    error: str | None = None


@dataclass(slots=True)
class RowResult:
    """What the router made of one row after retries and fallback."""

    completion: Completion | None
    error: str | None
    attempts: int
    deployment: str | None
    dead_letter: bool = False
    lane: str | None = None  # the answering deployment's lane when not realtime (flex)


def reply_with_usage(
    content: str,
    usage: Any,
    prompt_key: str,
    completion_key: str,
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    finish_reason: str | None = None,
    model: Any = None,
    body: str | None = None,
) -> ProviderReply:
    """A successful reply whose token counts come from a provider's ``usage`` object
    (missing or malformed counts are 0), its cached prompt tokens included
    (:func:`cached_tokens_of`)."""
    usage = usage if isinstance(usage, dict) else {}
    return ProviderReply(
        completion=Completion(
            content=content,
            prompt_tokens=_count(usage.get(prompt_key)),
            completion_tokens=_count(usage.get(completion_key)),
            tool_calls=tool_calls or None,
            finish_reason=finish_reason,
            model=model if isinstance(model, str) else None,
            body=body,
            cached_tokens=cached_tokens_of(usage),
        )
    )


def cached_tokens_of(usage: Any) -> int:
    """The prompt tokens a provider's ``usage`` says were read from its prompt cache:
    OpenAI's ``prompt_tokens_details.cached_tokens``, Anthropic's
    ``cache_read_input_tokens`` (0 when neither is given)."""
    if not isinstance(usage, dict):
        return 0
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and "cached_tokens" in details:
        return _count(details.get("cached_tokens"))
    return _count(usage.get("cache_read_input_tokens"))


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
