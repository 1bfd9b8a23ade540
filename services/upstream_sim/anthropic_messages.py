"""The Anthropic Messages endpoint (``POST /v1/messages``): the request validated as the
Messages API does (``x-api-key`` (any value, else 401) and ``anthropic-version`` headers,
``model``, ``max_tokens``, user/assistant turns of text, image, ``tool_use`` and
``tool_result`` blocks (each tool result answering a ``tool_use`` of the assistant turn
right before it, each tool use answered in the next turn), ``tools``, ``tool_choice`` and
no unknown top-level field), the echo in the Messages shape (content blocks,
``stop_reason``, ``usage`` in input/output tokens) and Anthropic's ``{type: "error",
error}`` error object."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

from relay_batches.services.upstream_sim.echo import (
    ChatRequest,
    InvalidRequest,
    estimate_tokens,
    json_object,
    json_response,
    prompt_tokens,
    reply_text,
    tool_call,
)

ANTHROPIC_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
MESSAGES_FIELDS = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "metadata",
        "stream",
    }
)


def parse_messages_request(body: bytes, headers: Mapping[str, str]) -> ChatRequest:
    """Decode and validate a Messages body and its headers; raise :class:`InvalidRequest`
    as the Messages API would refuse it."""
    check_messages_headers(headers)
    return messages_request_from(json_object(body))


def check_messages_headers(headers: Mapping[str, str], *, bearer: bool = False) -> None:
    """Raise :class:`InvalidRequest` when the Messages API's headers are missing; with
    ``bearer`` an ``Authorization: Bearer`` key (what the current official SDK sends)
    stands for ``x-api-key``."""
    keyed = bool(headers.get("x-api-key"))
    if bearer and headers.get("Authorization", "").startswith("Bearer "):
        keyed = True
    if not keyed:
        raise InvalidRequest("x-api-key header is required", status=401)
    if not headers.get("anthropic-version"):
        raise InvalidRequest("anthropic-version: header is required")


def messages_request_from(data: Mapping[str, Any]) -> ChatRequest:
    """Validate a decoded Messages body (a batch request's ``params``) as
    :func:`parse_messages_request` does, headers aside."""
    for key in data:
        if key not in MESSAGES_FIELDS:
            raise InvalidRequest(f"{key}: Extra inputs are not permitted")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model: Field required")
    max_tokens = data.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InvalidRequest("max_tokens: Field required (an integer of at least 1)")
    if data.get("stream"):
        raise InvalidRequest("stream: the simulator does not stream")
    _check_sampling(data)
    system = _system_text(data.get("system"))
    contents, last_user = _check_turns(data.get("messages"))
    return ChatRequest(
        model=model,
        contents=(system, *contents) if system else contents,
        last_user=last_user,
        tool=_messages_tool(data.get("tools"), data.get("tool_choice")),
        max_tokens=max_tokens,
    )


def _check_sampling(data: Mapping[str, Any]) -> None:
    for key in ("temperature", "top_p"):
        value = data.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1
        ):
            raise InvalidRequest(f"{key}: Input should be a number from 0 to 1")
    stops = data.get("stop_sequences")
    if stops is not None and (
        not isinstance(stops, list) or not all(isinstance(s, str) for s in stops)
    ):
        raise InvalidRequest("stop_sequences: Input should be a list of strings")


def _system_text(system: Any) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    if isinstance(system, list) and all(_is_text_block(b) for b in system):
        return "".join(block["text"] for block in system)
    raise InvalidRequest("system: Input should be a string or a list of text blocks")


def _is_text_block(block: Any) -> bool:
    return (
        isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
    )


def _check_turns(messages: Any) -> tuple[tuple[str, ...], str]:
    """The text of every turn and of the last user turn, once the turns are checked."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages: Input should be a non-empty list")
    texts: list[str] = []
    last_user = ""
    pending: set[str] = set()  # tool_use ids of the turn before, to be answered now
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise InvalidRequest(f"{where}.role: Input should be 'user' or 'assistant'")
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list) or not blocks:
            raise InvalidRequest(f"{where}.content: Input should be a string or a list of blocks")
        answered = {
            block.get("tool_use_id")
            for block in blocks
            if isinstance(block, dict) and block.get("type") == "tool_result"
        }
        if pending - answered:
            raise InvalidRequest(
                f"{where}: tool_use ids were found without tool_result blocks immediately"
                f" after: {', '.join(sorted(pending - answered))}"
            )
        if answered - pending:
            raise InvalidRequest(
                f"{where}: unexpected tool_use_id found in tool_result blocks:"
                f" {', '.join(sorted(str(i) for i in answered - pending))}"
            )
        pending = set()
        parts = []
        for j, block in enumerate(blocks):
            text, tool_use = _check_block(block, role, f"{where}.content.{j}")
            parts.append(text)
            if tool_use is not None:
                pending.add(tool_use)
        texts.append("".join(parts))
        if role == "user":
            last_user = texts[-1]
    return tuple(texts), last_user


def _check_block(block: Any, role: str, where: str) -> tuple[str, str | None]:
    """The text a content block carries and, for a ``tool_use``, its id."""
    kind = block.get("type") if isinstance(block, dict) else None
    if kind == "text" and isinstance(block.get("text"), str):
        return block["text"], None
    if kind == "image" and _is_image_source(block.get("source")):
        return "", None
    if kind == "tool_use" and role == "assistant":
        if not (
            isinstance(block.get("id"), str)
            and isinstance(block.get("name"), str)
            and isinstance(block.get("input"), dict)
        ):
            raise InvalidRequest(f"{where}: a tool_use block needs id, name and an input object")
        return "", block["id"]
    if kind == "tool_result" and role == "user":
        content = block.get("content", "")
        if isinstance(content, str):
            return content, None
        if isinstance(content, list) and all(_is_text_block(b) for b in content):
            return "".join(b["text"] for b in content), None
        raise InvalidRequest(f"{where}.content: a tool result holds a string or text blocks")
    raise InvalidRequest(f"{where}: not a valid {role} content block")


def _is_image_source(source: Any) -> bool:
    if not isinstance(source, dict):
        return False
    if source.get("type") == "base64":
        return source.get("media_type") in ANTHROPIC_IMAGE_TYPES and isinstance(
            source.get("data"), str
        )
    return source.get("type") == "url" and isinstance(source.get("url"), str)


def _messages_tool(tools: Any, choice: Any) -> str | None:
    """The tool a Messages request's ``[sim:tool-call]`` calls."""
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(
        isinstance(tool, dict)
        and isinstance(tool.get("name"), str)
        and isinstance(tool.get("input_schema"), dict)
        and tool["input_schema"].get("type") == "object"
        for tool in tools
    ):
        raise InvalidRequest("tools: each tool needs a name and an object input_schema")
    if choice is not None and not (
        isinstance(choice, dict)
        and choice.get("type") in ("auto", "any", "tool", "none")
        and (choice.get("type") != "tool" or isinstance(choice.get("name"), str))
    ):
        raise InvalidRequest("tool_choice: Input should be auto, any, tool (with a name) or none")
    if not tools or (choice or {}).get("type") == "none":
        return None
    if choice is not None and choice.get("type") == "tool":
        name: str = choice["name"]
        return name
    first: str = tools[0]["name"]
    return first


def message_payload(chat: ChatRequest, reply_bytes: int | None = None) -> dict[str, object]:
    """The Messages ``message`` object answering ``chat``: a text block with the echo
    (padded to ``reply_bytes`` when given), or a ``tool_use`` block for the call it
    triggers."""
    block: dict[str, object]
    if chat.calls_tool:
        digest, name, arguments = tool_call(chat)
        block = {"type": "tool_use", "id": "toolu_" + digest, "name": name, "input": arguments}
        stop_reason, output_tokens = "tool_use", estimate_tokens(orjson.dumps(arguments).decode())
    else:
        reply = reply_text(chat, reply_bytes)
        block = {"type": "text", "text": reply}
        stop_reason, output_tokens = "end_turn", estimate_tokens(reply)
    return {
        "id": "msg_" + os.urandom(12).hex(),
        "type": "message",
        "role": "assistant",
        "model": chat.model,
        "content": [block],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": prompt_tokens(chat), "output_tokens": output_tokens},
    }


def anthropic_error_type(status: int) -> str:
    """The Messages API's error ``type`` for an HTTP status."""
    named = {
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        529: "overloaded_error",
    }
    return named.get(status, "api_error" if status >= 500 else "invalid_request_error")


def anthropic_error_response(
    status: int, message: str, retry_after: int | None = None
) -> web.Response:
    """A Messages API error object, with ``Retry-After`` when given."""
    headers = None if retry_after is None else {"Retry-After": str(retry_after)}
    payload = anthropic_error_payload(status, message)
    return json_response(payload, status=status, headers=headers)


def anthropic_error_payload(status: int, message: str) -> dict[str, object]:
    """The body of a Messages API error answer for an HTTP status."""
    return {"type": "error", "error": {"type": anthropic_error_type(status), "message": message}}
