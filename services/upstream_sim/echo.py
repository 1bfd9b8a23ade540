"""The request as the simulator reads it, and the echo it answers, on both endpoints.

The echoed text is the text of the last user message (content parts: their text parts
joined); a ``tool`` message (chat) or a user turn of tool results (Messages) counts as a
user message, its result text echoed, so a conversation answering a tool call gets text.

``[sim:tool-call]`` in that last user text, on a request with ``tools``, answers with a
call of the first tool instead (or of the tool ``tool_choice`` names; none when
``tool_choice`` is ``none``): arguments ``{"text": <the last user text>}``, id
``call_<24 hex>`` (Messages: ``toolu_<24 hex>``) derived from that text and the tool's
name, no content, ``finish_reason: "tool_calls"`` (Messages: a ``tool_use`` block,
``stop_reason: "tool_use"``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from relay_batches.services.upstream_sim.faults import (
    MARKER,
    NO_TRIGGERS,
    Triggers,
    parse_triggers,
)

TOOL_CALL_MARKER = "[sim:tool-call]"


def estimate_tokens(text: str) -> int:
    """A rough token count: one per four characters, at least one."""
    return max(1, (len(text) + 3) // 4)


class InvalidRequest(ValueError):
    """The request is not one the endpoint takes; ``status`` is the HTTP answer (400,
    or 401 for a Messages call without ``x-api-key``)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """What the simulator needs from a chat completions or Messages request; ``tool`` is
    the name of the tool a ``[sim:tool-call]`` calls (None: no tool may be called);
    ``choices`` how many choices to answer (chat ``n``), ``top_logprobs`` None unless
    the request asked for log probabilities (then how many alternatives each token has)."""

    model: str
    contents: tuple[str, ...]
    last_user: str
    tool: str | None = None
    max_tokens: int | None = None
    choices: int = 1
    top_logprobs: int | None = None
    flex: bool = False  # asked for service_tier "flex" (OpenAI's flex lane)

    @property
    def calls_tool(self) -> bool:
        """True when the reply is a tool call rather than the echo."""
        return self.tool is not None and TOOL_CALL_MARKER in self.last_user

    def triggers(self) -> Triggers:
        """The triggers found anywhere in the message contents."""
        if not any(MARKER in content for content in self.contents):
            return NO_TRIGGERS
        return parse_triggers("\n".join(self.contents))


def content_text(content: Any) -> str:
    """The text of a message content: a string, or the text parts of a parts list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def json_object(body: bytes) -> dict[str, Any]:
    """A request body decoded as a JSON object; :class:`InvalidRequest` when it is not one."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise InvalidRequest("request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise InvalidRequest("request body must be a JSON object")
    return data


def json_response(
    payload: object, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """An ``application/json`` response encoded with orjson."""
    return web.Response(
        body=orjson.dumps(payload), status=status, content_type="application/json", headers=headers
    )


def reply_text(chat: ChatRequest, reply_bytes: int | None) -> str:
    """The echo answering ``chat``, padded with dots to ``reply_bytes`` when given."""
    reply = "echo: " + chat.last_user
    if reply_bytes is not None:
        reply += "." * (reply_bytes - len(reply.encode()))
    return reply


def tool_call(chat: ChatRequest) -> tuple[str, str, dict[str, str]]:
    """The 24-hex id, tool name and arguments of the call ``chat`` triggers."""
    name = chat.tool or ""
    digest = hashlib.blake2b(f"{name}\n{chat.last_user}".encode(), digest_size=12).hexdigest()
    return digest, name, {"text": chat.last_user}


def prompt_tokens(chat: ChatRequest) -> int:
    """The tokens of ``chat``'s prompt: those of every message content."""
    return sum(estimate_tokens(content) for content in chat.contents)


def call_tokens(chat: ChatRequest, reply_bytes: int | None = None) -> int:
    """What a call counts against a tokens-per-minute limit: its prompt tokens plus its
    ``max_tokens``, or without one the tokens of the reply it gets."""
    if chat.max_tokens is not None:
        return prompt_tokens(chat) + chat.max_tokens
    return prompt_tokens(chat) + estimate_tokens(reply_text(chat, reply_bytes))
