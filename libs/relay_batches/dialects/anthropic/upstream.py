"""The Anthropic Messages API provider (``POST {base_url}/messages``).

A row is a chat-completions request; this module translates it to a Messages request
and the reply back. Request, field by field:

- ``system`` and ``developer`` messages → the top-level ``system`` text (joined by a
  blank line); other messages keep their order.
- content parts → content blocks: ``text`` → text; ``image_url`` with a ``data:`` URL →
  a base64 image source, with an http(s) URL → a url image source.
- assistant ``tool_calls`` → ``tool_use`` blocks (``input`` = the parsed JSON
  arguments) after the assistant's text; ``tool`` messages → ``tool_result`` blocks in
  one user turn (consecutive tool messages, and a user message right after them, share it).
- ``tools`` → Anthropic tools (``input_schema`` from ``parameters``); ``tool_choice``
  none/auto/required/{function} → none/auto/any/tool; ``parallel_tool_calls: false`` →
  ``disable_parallel_tool_use``.
- ``stop`` → ``stop_sequences``; ``max_completion_tokens`` (else ``max_tokens``) →
  ``max_tokens``, which the API requires: :data:`DEFAULT_MAX_TOKENS` when neither is set;
  ``temperature`` (at most 1) and ``top_p`` as they are; ``user`` (else
  ``safety_identifier``) → ``metadata.user_id``; ``response_format``
  ``{"type": "text"}`` is the default and sends nothing, as do a chat field's neutral
  values (:data:`NEUTRAL_VALUES`: ``n: 1``, ``logprobs: false``, zero penalties,
  ``store: false``, ``stream: false``).

Anything else a row carries that the Messages API cannot honour — ``seed``, a JSON
``response_format``, a message ``name``, an image ``detail``, ``logit_bias``, ``n``
above 1, ``logprobs``, ``audio``, ``reasoning_effort``, ``metadata``, … — raises
:class:`~relay_batches.router.types.UnsupportedRequest` naming it, so the router falls
through to the alias's next deployment (and the row fails with that error when none is
left) rather than dropping what the row asked for. A field set to ``null`` is treated as
not set. A deployment's ``params`` are defaults in the same chat vocabulary, overridden
by the row's.

Reply: text blocks joined as the content, ``tool_use`` blocks as chat tool calls, the
stop reason as a finish reason (:data:`FINISH_REASONS`), usage (prompt tokens include the
cache's, as chat completions count them) and model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from relay_batches.ratelimit.estimate import completion_cap
from relay_batches.router.aliases import Deployment
from relay_batches.router.types import ProviderReply, UnsupportedRequest, reply_with_usage

API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 1024
SYSTEM_ROLES = frozenset({"system", "developer"})
IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
TOKEN_LIMITS = ("max_completion_tokens", "max_tokens")
# Chat fields whose value here is the chat default, which the Messages API behaves as.
NEUTRAL_VALUES: dict[str, Any] = {
    "n": 1,
    "logprobs": False,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "store": False,
    "stream": False,
}
HANDLED_PARAMS = frozenset(
    {
        "temperature",
        "top_p",
        "stop",
        "user",
        "safety_identifier",
        "response_format",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        *TOKEN_LIMITS,
    }
)
_DATA_URL = re.compile(r"data:([\w.+-]+/[\w.+-]+);base64,(.*)", re.DOTALL)


def _refuse(what: str) -> UnsupportedRequest:
    return UnsupportedRequest(f"anthropic deployments cannot take {what}")


def translate_body(
    deployment: Deployment, messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any]
) -> dict[str, Any]:
    """The Messages API body for chat ``messages`` and request ``params``; raises
    :class:`UnsupportedRequest` for what the API cannot take."""
    defaults = deployment.params
    if any(params.get(key) is not None for key in TOKEN_LIMITS):
        defaults = {k: v for k, v in defaults.items() if k not in TOKEN_LIMITS}
    merged = {k: v for k, v in {**defaults, **params}.items() if v is not None}
    system, turns = _translate_messages(messages)
    body: dict[str, Any] = {"model": deployment.model, "max_tokens": _max_tokens(merged)}
    if system:
        body["system"] = system
    body["messages"] = turns
    _translate_sampling(merged, body)
    _translate_tools(merged, body)
    for key, value in merged.items():
        if key not in HANDLED_PARAMS and not _neutral(key, value):
            raise _refuse(key)
    return body


def _neutral(key: str, value: Any) -> bool:
    if key not in NEUTRAL_VALUES:
        return False
    neutral = NEUTRAL_VALUES[key]
    return value == neutral and isinstance(value, bool) == isinstance(neutral, bool)


def token_cap(deployment: Deployment, params: Mapping[str, Any]) -> int:
    """The ``max_tokens`` a call sends (what a tokens-per-minute limit counts): the
    row's cap, else the deployment's, else :data:`DEFAULT_MAX_TOKENS`."""
    defaults = deployment.params
    if any(params.get(key) is not None for key in TOKEN_LIMITS):
        defaults = {}
    merged = {k: v for k, v in {**defaults, **params}.items() if v is not None}
    value = _max_tokens(merged)
    return completion_cap({"max_tokens": value})


def _max_tokens(merged: Mapping[str, Any]) -> Any:
    for key in TOKEN_LIMITS:
        if key in merged:
            return merged[key]
    return DEFAULT_MAX_TOKENS


def _translate_sampling(merged: Mapping[str, Any], body: dict[str, Any]) -> None:
    temperature = merged.get("temperature")
    if temperature is not None:
        if isinstance(temperature, int | float) and temperature > 1:
            raise _refuse(f"temperature above 1 (got {temperature:g})")
        body["temperature"] = temperature
    if "top_p" in merged:
        body["top_p"] = merged["top_p"]
    if "stop" in merged:
        stop = merged["stop"]
        body["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    user = merged.get("user", merged.get("safety_identifier"))
    if user is not None:
        body["metadata"] = {"user_id": user}
    response_format = merged.get("response_format")
    if response_format is not None:
        kind = response_format.get("type") if isinstance(response_format, Mapping) else None
        if kind != "text":
            raise _refuse(f"response_format of type {kind!r}")


def _translate_tools(merged: Mapping[str, Any], body: dict[str, Any]) -> None:
    tools = merged.get("tools")
    if tools:
        body["tools"] = [_tool(i, tool) for i, tool in enumerate(tools)]
    choice = _tool_choice(merged.get("tool_choice"))
    if merged.get("parallel_tool_calls") is False and (choice or {}).get("type") != "none":
        choice = {**(choice or {"type": "auto"}), "disable_parallel_tool_use": True}
    if choice is not None and (tools or choice["type"] != "none"):
        body["tool_choice"] = choice


def _tool(index: int, tool: Any) -> dict[str, Any]:
    where = f"tools[{index}]"
    if not isinstance(tool, Mapping) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        raise _refuse(f"{where} of type {kind!r}")
    function = tool.get("function")
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise _refuse(f"{where}.function without a name")
    if function.get("strict"):
        raise _refuse(f"{where}.function.strict")
    translated: dict[str, Any] = {"name": function["name"]}
    if function.get("description") is not None:
        translated["description"] = function["description"]
    parameters = function.get("parameters")
    translated["input_schema"] = (
        parameters if parameters is not None else {"type": "object", "properties": {}}
    )
    return translated


def _tool_choice(choice: Any) -> dict[str, Any] | None:
    if choice is None:
        return None
    named = {"none": "none", "auto": "auto", "required": "any"}
    if isinstance(choice, str) and choice in named:
        return {"type": named[choice]}
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        function = choice.get("function")
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            return {"type": "tool", "name": function["name"]}
    raise _refuse(f"tool_choice {orjson.dumps(choice).decode()}")


def _translate_messages(
    messages: Sequence[Mapping[str, Any]],
) -> tuple[str, list[dict[str, Any]]]:
    """The ``system`` text and the Messages turns of chat ``messages``."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    results_turn: dict[str, Any] | None = None  # the user turn holding tool results
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        role = message.get("role")
        if message.get("name") is not None:
            raise _refuse(f"{where}.name")
        if role in SYSTEM_ROLES:
            system.append(_system_text(message.get("content"), where))
            continue
        if role == "tool":
            block = _tool_result(message, where)
            if results_turn is None:
                results_turn = {"role": "user", "content": []}
                turns.append(results_turn)
            results_turn["content"].append(block)
            continue
        if role == "user":
            content = _user_content(message.get("content"), where)
            if results_turn is not None:
                extra = [{"type": "text", "text": content}] if isinstance(content, str) else content
                results_turn["content"].extend(extra)
            else:
                turns.append({"role": "user", "content": content})
        elif role == "assistant":
            turns.append({"role": "assistant", "content": _assistant_content(message, where)})
        else:
            raise _refuse(f"{where}.role {role!r}")
        results_turn = None
    return "\n\n".join(system), turns


def _system_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content or ()):
        if not isinstance(part, Mapping) or part.get("type") != "text":
            raise _refuse(f"{where}.content[{j}] (only text is a system prompt)")
        texts.append(part["text"])
    return "".join(texts)


def _user_content(content: Any, where: str) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    return [_user_block(part, f"{where}.content[{j}]") for j, part in enumerate(content or ())]


def _user_block(part: Any, where: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, Mapping) else None
    if kind == "text":
        return {"type": "text", "text": part["text"]}
    if kind != "image_url":
        raise _refuse(f"{where} of type {kind!r}")
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, Mapping) else None
    if not isinstance(url, str):
        raise _refuse(f"{where}.image_url without a url")
    detail = image.get("detail") if isinstance(image, Mapping) else None
    if detail not in (None, "auto"):
        raise _refuse(f"{where}.image_url.detail {detail!r}")
    if url.startswith(("http://", "https://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    match = _DATA_URL.fullmatch(url)
    if match is None:
        raise _refuse(f"{where}.image_url.url that is neither http(s) nor a base64 data URL")
    media_type, data = match.groups()
    if media_type not in IMAGE_TYPES:
        raise _refuse(f"{where}.image_url of media type {media_type!r}")
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def _assistant_content(message: Mapping[str, Any], where: str) -> str | list[dict[str, Any]]:
    content = message.get("content")
    calls = message.get("tool_calls") or ()
    if isinstance(content, str) and not calls:
        return content
    blocks: list[dict[str, Any]] = []
    if isinstance(content, str):
        if content:
            blocks.append({"type": "text", "text": content})
    else:
        for j, part in enumerate(content or ()):
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind != "text":
                raise _refuse(f"{where}.content[{j}] of type {kind!r}")
            blocks.append({"type": "text", "text": part["text"]})
    blocks.extend(_tool_use(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(calls))
    return blocks


def _tool_use(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or call.get("type", "function") != "function":
        raise _refuse(f"{where} that is not a function call")
    try:
        arguments = orjson.loads(function.get("arguments") or "{}")
    except (orjson.JSONDecodeError, TypeError):
        arguments = None
    if not isinstance(arguments, dict):
        raise _refuse(f"{where}.function.arguments that are not a JSON object")
    return {
        "type": "tool_use",
        "id": call.get("id"),
        "name": function.get("name"),
        "input": arguments,
    }


def _tool_result(message: Mapping[str, Any], where: str) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, str):
        blocks = []
        for j, part in enumerate(content or ()):
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise _refuse(f"{where}.content[{j}] (a tool result holds text only)")
            blocks.append({"type": "text", "text": part["text"]})
        content = blocks
    return {"type": "tool_result", "tool_use_id": message.get("tool_call_id"), "content": content}


def build_request(
    deployment: Deployment, messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any]
) -> tuple[str, dict[str, str], bytes]:
    """URL, headers and body of one Messages call; raises :class:`UnsupportedRequest`
    for what the API cannot take."""
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
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    "pause_turn": "stop",
}


CACHE_TOKENS = ("cache_creation_input_tokens", "cache_read_input_tokens")


def _prompt_usage(usage: Any) -> Any:
    """``usage`` with the prompt's cached tokens counted in ``input_tokens``, as a chat
    completion's ``prompt_tokens`` counts them (the Messages API counts them apart)."""
    if not isinstance(usage, dict) or not any(key in usage for key in CACHE_TOKENS):
        return usage
    counts = [usage.get(key) for key in ("input_tokens", *CACHE_TOKENS)]
    total = sum(c for c in counts if isinstance(c, int) and not isinstance(c, bool))
    return {**usage, "input_tokens": total}


def _tool_call(block: dict[str, Any]) -> dict[str, Any]:
    """A ``tool_use`` block as a chat tool call; KeyError or TypeError when the block is
    not a well-formed one (string id and name, object input)."""
    call_id, name, arguments = block["id"], block["name"], block["input"]
    if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, dict):
        raise TypeError("malformed tool_use block")
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
    }


def parse_reply(raw: bytes) -> ProviderReply:
    """The reply's text blocks joined, its ``tool_use`` blocks as chat-completions tool
    calls, its stop reason as a finish reason, and its usage. A text block without
    string text or a ``tool_use`` block without string id and name or object input
    makes the reply malformed."""
    try:
        data = orjson.loads(raw)
        blocks = data["content"]
        texts = [b["text"] for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
        if not all(isinstance(t, str) for t in texts):
            raise TypeError("malformed text block")
        text = "".join(texts)
        tool_calls = [
            _tool_call(b) for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"
        ]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return ProviderReply(error="malformed response from upstream")
    stop_reason = data.get("stop_reason")
    return reply_with_usage(
        text,
        _prompt_usage(data.get("usage")),
        "input_tokens",
        "output_tokens",
        tool_calls=tool_calls,
        finish_reason=FINISH_REASONS.get(stop_reason) if isinstance(stop_reason, str) else None,
        model=data.get("model"),
    )
