"""The OpenAI-compatible chat completions endpoint (``POST /v1/chat/completions``): the
request read as the simulator needs it, the ``chat.completion`` answering it and the
OpenAI-style error object."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

from relay_batches.services.upstream_sim.config import MODEL_ID
from relay_batches.services.upstream_sim.echo import (
    ChatRequest,
    InvalidRequest,
    content_text,
    estimate_tokens,
    json_object,
    json_response,
    prompt_tokens,
    reply_text,
    tool_call,
)


def parse_chat_request(body: bytes) -> ChatRequest:
    """Decode a chat completions body; raise :class:`InvalidRequest` when it is not one
    (besides the shape of ``messages``: ``tools`` that are not function tools, or a
    ``tool`` message answering no earlier assistant tool call)."""
    return chat_request_from(json_object(body))


def chat_request_from(data: Mapping[str, Any]) -> ChatRequest:
    """Read a decoded chat completions body (a batch line's ``body``) as
    :func:`parse_chat_request` does."""
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list")
    if not all(isinstance(message, dict) for message in messages):
        raise InvalidRequest("every message must be an object")
    contents = tuple(content_text(message.get("content")) for message in messages)
    last_user = ""
    call_ids: set[Any] = set()
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            call_ids.update(_chat_call_ids(message["tool_calls"], index))
        elif role == "tool" and message.get("tool_call_id") not in call_ids:
            raise InvalidRequest(f"messages[{index}] answers no earlier assistant tool call")
        if role in ("user", "tool"):
            last_user = contents[index]
    model = data.get("model")
    return ChatRequest(
        model=model if isinstance(model, str) else MODEL_ID,
        contents=contents,
        last_user=last_user,
        tool=_chat_tool(data.get("tools"), data.get("tool_choice")),
        max_tokens=_max_tokens(data.get("max_completion_tokens", data.get("max_tokens"))),
        choices=_max_tokens(data.get("n")) or 1,
        top_logprobs=_top_logprobs(data),
        flex=data.get("service_tier") == "flex",
    )


def _top_logprobs(data: Mapping[str, Any]) -> int | None:
    """None unless ``logprobs`` is true; then ``top_logprobs`` (0 when absent)."""
    if data.get("logprobs") is not True:
        return None
    top = data.get("top_logprobs")
    return top if isinstance(top, int) and not isinstance(top, bool) and top > 0 else 0


def _max_tokens(value: Any) -> int | None:
    """A request's completion-token cap, when it gives a positive integer one."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def _chat_call_ids(calls: Any, index: int) -> list[Any]:
    if not isinstance(calls, list) or not all(
        isinstance(call, dict) and isinstance(call.get("id"), str) for call in calls
    ):
        raise InvalidRequest(f"messages[{index}].tool_calls must be a list of calls with ids")
    return [call["id"] for call in calls]


def _chat_tool(tools: Any, choice: Any) -> str | None:
    """The tool a chat request's ``[sim:tool-call]`` calls."""
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(
        isinstance(tool, dict)
        and tool.get("type") == "function"
        and isinstance(tool.get("function"), dict)
        and isinstance(tool["function"].get("name"), str)
        for tool in tools
    ):
        raise InvalidRequest("'tools' must be a list of function tools with names")
    if not tools or choice == "none":
        return None
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if isinstance(name, str):
            return name
    name = tools[0]["function"]["name"]
    return name if isinstance(name, str) else None


def error_response(
    status: int, message: str, error_type: str, retry_after: int | None = None
) -> web.Response:
    """An OpenAI-style error object, with ``Retry-After`` when given."""
    headers = None if retry_after is None else {"Retry-After": str(retry_after)}
    return json_response(error_payload(message, error_type), status=status, headers=headers)


def error_payload(message: str, error_type: str) -> dict[str, object]:
    """The body of an OpenAI-style error answer."""
    return {"error": {"message": message, "type": error_type}}


def completion_payload(chat: ChatRequest, reply_bytes: int | None = None) -> dict[str, object]:
    """The ``chat.completion`` object answering ``chat``: the echo, its content padded
    with dots to ``reply_bytes`` when given, or the tool call it triggers; ``n`` choices
    alike (each counted in usage), each with ``logprobs`` when they were asked for."""
    if chat.calls_tool:
        digest, name, arguments = tool_call(chat)
        encoded = orjson.dumps(arguments).decode()
        function = {"name": name, "arguments": encoded}
        call: dict[str, object] = {"id": "call_" + digest, "type": "function", "function": function}
        message: dict[str, object] = {"role": "assistant", "content": None, "tool_calls": [call]}
        finish_reason, completion_tokens = "tool_calls", estimate_tokens(encoded)
    else:
        reply = reply_text(chat, reply_bytes)
        message = {"role": "assistant", "content": reply}
        finish_reason, completion_tokens = "stop", estimate_tokens(reply)
    prompt = prompt_tokens(chat)
    choice: dict[str, object] = {"message": message, "finish_reason": finish_reason}
    if chat.top_logprobs is not None:
        choice["logprobs"] = _logprobs(message, chat.top_logprobs)
    completion_tokens *= chat.choices
    return {
        "id": "chatcmpl-" + os.urandom(12).hex(),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": chat.model,
        "choices": [{"index": i, **choice} for i in range(chat.choices)],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens,
        },
    }


def _logprobs(message: Mapping[str, Any], top: int) -> dict[str, object]:
    """Deterministic log probabilities of a message's words: each certain (0.0), with
    ``top`` alternatives of lower probability."""
    content = message.get("content")
    words = content.split(" ") if isinstance(content, str) and content else []
    return {
        "content": [
            {
                "token": word,
                "logprob": 0.0,
                "bytes": list(word.encode()),
                "top_logprobs": [
                    {"token": word, "logprob": -float(rank), "bytes": list(word.encode())}
                    for rank in range(top)
                ],
            }
            for word in words
        ],
        "refusal": None,
    }
