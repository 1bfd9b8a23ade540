"""Anthropic Messages parameters translated into the stored chat request (the vocabulary
of :mod:`relay_batches.dialects.chat`): ``system`` becomes a leading system message; text
and image blocks content parts (a base64 image a ``data:`` URL); ``tool_use`` blocks
assistant ``tool_calls`` (``arguments`` the JSON text of ``input``); each ``tool_result``
block a ``tool`` message; ``tools`` function tools; ``tool_choice`` auto/any/tool/none
auto/required/function/none; ``stop_sequences`` ``stop``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from relay_batches.dialects.chat import FAST_PARAMS

_SIMPLE_PARAMS = frozenset({"model", "max_tokens", "messages", "system", "temperature", "top_p"})
_ANTHROPIC_ROLES = frozenset({"user", "assistant"})
_token_count = FAST_PARAMS["max_tokens"]
_unit = FAST_PARAMS["top_p"]  # Anthropic's temperature is 0 to 1 too


def simple_translation(params: dict[str, Any]) -> dict[str, Any] | None:
    """The fast path of the common request, which :class:`AnthropicParams` always accepts:
    string turns of ``user``/``assistant``, a string ``system`` (or none), ``model``, and
    ``max_tokens``, ``temperature``, ``top_p`` in range; translated as :func:`translate`
    does. None for any other request (the model then accepts it or says why)."""
    if not _SIMPLE_PARAMS.issuperset(params) or type(params.get("model")) is not str:
        return None
    messages = params.get("messages")
    if (
        type(params.get("system", "")) is not str
        or type(messages) is not list
        or not messages
        or not _token_count(params.get("max_tokens"))
        or ("temperature" in params and not _unit(params["temperature"]))
        or ("top_p" in params and not _unit(params["top_p"]))
    ):
        return None
    roles = _ANTHROPIC_ROLES
    for message in messages:
        if (
            type(message) is not dict
            or len(message) != 2
            or type(role := message.get("role")) is not str
            or role not in roles
            or type(message.get("content")) is not str
        ):
            return None
    turns = messages
    if "system" in params:
        turns = [{"role": "system", "content": params["system"]}, *messages]
    chat = {"model": params["model"], "max_tokens": params["max_tokens"], "messages": turns}
    for key in ("temperature", "top_p"):
        if key in params:
            chat[key] = params[key]
    return chat


def translate(params: dict[str, Any]) -> dict[str, Any]:
    """Validated Messages params as a chat request (absent fields stay absent)."""
    messages: list[dict[str, Any]] = []
    if (system := params.get("system")) is not None:
        messages.append({"role": "system", "content": _text(system)})
    for message in params["messages"]:
        messages.extend(_turn(message["role"], message["content"]))
    chat: dict[str, Any] = {
        "model": params["model"],
        "max_tokens": params["max_tokens"],
        "messages": messages,
    }
    for key in ("temperature", "top_p"):
        if params.get(key) is not None:
            chat[key] = params[key]
    if params.get("stop_sequences") is not None:
        chat["stop"] = params["stop_sequences"]
    if params.get("tools") is not None:
        chat["tools"] = [_tool(t) for t in params["tools"]]
    if params.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(params["tool_choice"])
    return chat


def _text(content: str | Sequence[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    return [{"type": "text", "text": block["text"]} for block in content]


def _turn(role: str, content: str | list[dict[str, Any]]) -> Iterable[dict[str, Any]]:
    """One Anthropic turn as chat messages: tool results become ``tool`` messages, in
    place; an assistant's ``tool_use`` blocks its ``tool_calls``."""
    if isinstance(content, str):
        yield {"role": role, "content": content}
        return
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for block in content:
        kind = block["type"]
        if kind == "text":
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block["source"])}})
        elif kind == "tool_use":
            arguments = orjson.dumps(block["input"]).decode()  # depth bounded: encodable
            function = {"name": block["name"], "arguments": arguments}
            calls.append({"id": block["id"], "type": "function", "function": function})
        else:  # tool_result: what came before it is one message, the result the next
            if parts:
                yield {"role": role, "content": parts}
                parts = []
            result = block.get("content")
            yield {
                "role": "tool",
                "tool_call_id": block["tool_use_id"],
                "content": "" if result is None else _text(result),
            }
    if calls:
        message: dict[str, Any] = {"role": role, "tool_calls": calls}
        if parts:
            message["content"] = parts
        yield message
    elif parts:
        yield {"role": role, "content": parts}


def _image_url(source: dict[str, Any]) -> str:
    if source["type"] == "url":
        return str(source["url"])
    return f"data:{source['media_type']};base64,{source['data']}"


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = {"name": tool["name"], "parameters": tool["input_schema"]}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: dict[str, Any]) -> object:
    kind = choice["type"]
    if kind == "tool":
        return {"type": "function", "function": {"name": choice["name"]}}
    return {"auto": "auto", "any": "required", "none": "none"}[kind]
