"""The dialects' request rows, translated into Relay's stored chat request.

:func:`openai_line_row`: one line of an OpenAI Batch input file,
``{custom_id, method: "POST", url: "/v1/chat/completions", body}``, whose ``body`` is a
chat request (checked by :class:`.chat_rows.ChatRequest`, ``body.model`` required).

:func:`anthropic_request_row`: one ``{custom_id, params}`` of an Anthropic Message
Batches create, whose ``params`` are Messages API parameters (the models below),
translated: ``system`` becomes a leading system message; text and image blocks content
parts (a base64 image a ``data:`` URL); ``tool_use`` blocks assistant ``tool_calls``
(``arguments`` the JSON text of ``input``); each ``tool_result`` block a ``tool``
message; ``tools`` function tools; ``tool_choice`` auto/any/tool/none
auto/required/function/none; ``stop_sequences`` ``stop``.

What either API allows but Relay cannot honour is refused naming the field, never
dropped: OpenAI's ``n`` above 1, ``stream``, ``logprobs``, penalties, ...; Anthropic's
``thinking``, ``top_k``, ``cache_control``, documents, ``metadata`` (Relay forwards no
end-user id to providers), a ``tool_result`` with ``is_error``. A field left at the
value that means "off" (``n: 1``, ``stream: false``) changes nothing and is accepted.

Both raise ``RowRejected(RowError(index, field, message))`` with ``field`` the path in
the line (``body.messages[0].content``, ``params.messages[0].content``) and return a
:class:`RowInput` stored in object form, always with its ``model``.
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterable, Sequence
from typing import Annotated, Any, ClassVar, Literal

import orjson
from pydantic import Field, ValidationError

from relay_batches.services.ingest_api.rows.chat_rows import (
    FAST_PARAMS,
    MAX_CUSTOM_ID_CHARS,
    ChatRequest,
    StopText,
    TokenCount,
    TopP,
    check_row,
    plain_messages,
    plain_params,
    stored_request,
)
from relay_batches.services.ingest_api.rows.shapes import (
    FreeObject,
    NestedObject,
    Shape,
    first_error,
    is_unicode,
    tagged,
    tagged_by,
    unencodable_path,
)
from relay_batches.services.ingest_api.rows.validation import (
    RowError,
    RowInput,
    RowRejected,
    SubmitLimits,
    check_unique_ids,
)

OPENAI_URL = "/v1/chat/completions"
ANTHROPIC_CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
# OpenAI body fields Relay cannot honour: the value that changes nothing, and why not.
_OPENAI_OFF: dict[str, tuple[object, str]] = {
    "n": (1, "must be 1: Relay runs one completion per row"),
    "stream": (False, "must be false: batch rows are not streamed"),
    "logprobs": (False, "must be false: Relay does not return log probabilities"),
    "parallel_tool_calls": (True, "must be true: Relay cannot turn off parallel tool calls"),
    "store": (False, "must be false: Relay does not store completions at the provider"),
}
_OPENAI_REFUSED = {
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
_NOT_TRANSLATED = "cannot be translated to a chat request (Relay runs rows on any provider)"
_LINE_FIELDS = ("body", "custom_id", "method", "url")
_PLAIN_CHAT = frozenset({"messages", "model"})


def _reject(index: int, field: str, message: str) -> RowRejected:
    return RowRejected(RowError(index, field, message))


def _custom_id(index: int, custom_id: object, anthropic: bool) -> str:
    if type(custom_id) is not str:
        problem = "is required" if custom_id is None else "must be a string"
        raise _reject(index, "custom_id", problem)
    if anthropic and not ANTHROPIC_CUSTOM_ID.fullmatch(custom_id):
        raise _reject(index, "custom_id", "must be 1 to 64 characters of a-z, A-Z, 0-9, _ and -")
    if len(custom_id) > MAX_CUSTOM_ID_CHARS:
        raise _reject(index, "custom_id", f"must be at most {MAX_CUSTOM_ID_CHARS} characters")
    if "\x00" in custom_id:  # Postgres text cannot hold NUL
        raise _reject(index, "custom_id", "must not contain NUL characters")
    if not is_unicode(custom_id):  # a lone surrogate: the ledger cannot store it
        raise _reject(index, "custom_id", "must be valid Unicode text")
    return custom_id


def _object(index: int, value: object, shape: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise _reject(index, "", f"must be a JSON object {shape}")
    return value


def _chat_row(
    index: int,
    custom_id: str,
    chat: dict[str, Any],
    prefix: str,
    limits: SubmitLimits,
    known_models: Container[str],
) -> RowInput:
    """``chat`` checked by the chat request model (errors under ``prefix``) and stored."""
    model = chat.get("model")
    if model is None:
        raise _reject(index, f"{prefix}.model", "is required")
    plain = (
        plain_params(chat, _PLAIN_CHAT)
        and type(model) is str
        and model in known_models
        and plain_messages(chat.get("messages"), limits.max_content_bytes)
    )  # the common case, which the model always accepts: no need to ask it
    problem = (
        None if plain else check_row(ChatRequest, chat, limits.max_content_bytes, known_models)
    )
    if problem is not None:
        field, message = problem
        raise _reject(index, f"{prefix}.{field}" if field else prefix, message)
    try:
        # A plain chat holds no null: stored_request's text, without its copying.
        request_json = (
            orjson.dumps(chat, option=orjson.OPT_SORT_KEYS).decode()
            if plain
            else stored_request(chat)
        )
    except TypeError:  # lone surrogates: only from a payload not built by orjson
        field = unencodable_path(chat)
        raise _reject(
            index, f"{prefix}.{field}" if field else prefix, "must be valid Unicode text"
        ) from None
    return RowInput(custom_id, request_json, chat["model"])


# --- OpenAI --------------------------------------------------------------------------


def openai_line_row(
    index: int, line: object, limits: SubmitLimits, known_models: Container[str]
) -> RowInput:
    """One decoded line of an OpenAI Batch input file, as a row (module docstring)."""
    line = _object(index, line, "{custom_id, method, url, body}")
    for key in line:
        if key not in _LINE_FIELDS:
            known = ", ".join(_LINE_FIELDS)
            raise _reject(index, str(key), f"is not a field of a batch line (fields: {known})")
    custom_id = _custom_id(index, line.get("custom_id"), anthropic=False)
    if line.get("method") != "POST":
        raise _reject(index, "method", "must be POST")
    if line.get("url") != OPENAI_URL:
        raise _reject(index, "url", f"must be {OPENAI_URL} (the only endpoint Relay runs)")
    body = line.get("body")
    if type(body) is not dict:
        raise _reject(index, "body", "is required" if body is None else "must be an object")
    chat: dict[str, Any] = {}
    for key, value in body.items():
        if key in _OPENAI_OFF:
            off, reason = _OPENAI_OFF[key]
            if value is not None and (type(value) is not type(off) or value != off):
                raise _reject(index, f"body.{key}", reason)
        elif key in _OPENAI_REFUSED:
            raise _reject(index, f"body.{key}", _OPENAI_REFUSED[key])
        else:
            chat[key] = value
    return _chat_row(index, custom_id, chat, "body", limits, known_models)


# --- Anthropic -----------------------------------------------------------------------

_CACHE = {"cache_control": "is not supported: Relay does not use prompt caching"}


class AnthropicText(Shape):
    """A text block."""

    NOUN: ClassVar[str] = "a text block"
    UNSUPPORTED: ClassVar[dict[str, str]] = {**_CACHE, "citations": _NOT_TRANSLATED}
    type: Literal["text"]
    text: str


class Base64Source(Shape):
    """An image's bytes, base64."""

    NOUN: ClassVar[str] = "a base64 image source"
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str


class UrlSource(Shape):
    """An image by URL."""

    NOUN: ClassVar[str] = "a url image source"
    type: Literal["url"]
    url: str


class AnthropicImage(Shape):
    """An image block."""

    NOUN: ClassVar[str] = "an image block"
    UNSUPPORTED: ClassVar[dict[str, str]] = _CACHE
    type: Literal["image"]
    source: Annotated[
        Annotated[Base64Source, tagged("base64")] | Annotated[UrlSource, tagged("url")],
        tagged_by("type", ("base64", "url")),
    ]


class ToolUse(Shape):
    """An assistant's tool call."""

    NOUN: ClassVar[str] = "a tool_use block"
    UNSUPPORTED: ClassVar[dict[str, str]] = _CACHE
    type: Literal["tool_use"]
    id: str
    name: str
    input: NestedObject


class ToolResult(Shape):
    """The result of a tool call (text only)."""

    NOUN: ClassVar[str] = "a tool_result block"
    UNSUPPORTED: ClassVar[dict[str, str]] = _CACHE
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[AnthropicText] | None = None
    is_error: Literal[False] | None = None


Block = Annotated[
    Annotated[AnthropicText, tagged("text")]
    | Annotated[AnthropicImage, tagged("image")]
    | Annotated[ToolUse, tagged("tool_use")]
    | Annotated[ToolResult, tagged("tool_result")],
    tagged_by("type", ("text", "image", "tool_use", "tool_result"), non_object="text"),
]


class AnthropicMessage(Shape):
    """One turn: ``user`` or ``assistant``, a string or content blocks."""

    NOUN: ClassVar[str] = "a message"
    role: Literal["user", "assistant"]
    content: str | Annotated[list[Block], Field(min_length=1)]


class AnthropicTool(Shape):
    """A client tool: a function with a JSON Schema for its input."""

    NOUN: ClassVar[str] = "a tool"
    UNSUPPORTED: ClassVar[dict[str, str]] = _CACHE
    type: Literal["custom"] | None = None
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")]
    description: str | None = None
    input_schema: FreeObject


class AutoChoice(Shape):
    """``tool_choice: {type: auto}``: the model decides."""

    NOUN: ClassVar[str] = "an auto tool_choice"
    type: Literal["auto"]
    disable_parallel_tool_use: Literal[False] | None = None


class AnyChoice(Shape):
    """``tool_choice: {type: any}``: the model must call some tool."""

    NOUN: ClassVar[str] = "an any tool_choice"
    type: Literal["any"]
    disable_parallel_tool_use: Literal[False] | None = None


class NamedToolChoice(Shape):
    """``tool_choice: {type: tool, name}``: the model must call the tool ``name``."""

    NOUN: ClassVar[str] = "a tool tool_choice"
    type: Literal["tool"]
    name: Annotated[str, Field(min_length=1)]
    disable_parallel_tool_use: Literal[False] | None = None


class NoneChoice(Shape):
    """``tool_choice: {type: none}``: the model must not call tools."""

    NOUN: ClassVar[str] = "a none tool_choice"
    type: Literal["none"]


AnthropicToolChoice = Annotated[
    Annotated[AutoChoice, tagged("auto")]
    | Annotated[AnyChoice, tagged("any")]
    | Annotated[NamedToolChoice, tagged("tool")]
    | Annotated[NoneChoice, tagged("none")],
    tagged_by("type", ("auto", "any", "tool", "none")),
]


class AnthropicParams(Shape):
    """The Messages API parameters of one batch request."""

    NOUN: ClassVar[str] = "the params"
    UNSUPPORTED: ClassVar[dict[str, str]] = {
        "thinking": _NOT_TRANSLATED,
        "top_k": _NOT_TRANSLATED,
        "container": _NOT_TRANSLATED,
        "mcp_servers": _NOT_TRANSLATED,
        "service_tier": _NOT_TRANSLATED,
        "stream": "is not supported: batch rows are not streamed",
        "metadata": "is not supported: Relay forwards no end-user id to providers",
    }
    model: str
    max_tokens: TokenCount
    messages: Annotated[list[AnthropicMessage], Field(min_length=1)]
    system: str | list[AnthropicText] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    stop_sequences: Annotated[list[StopText], Field(min_length=1, max_length=4)] | None = None
    temperature: TopP | None = None  # Anthropic's range is 0 to 1
    top_p: TopP | None = None


def anthropic_request_row(
    index: int, request: object, limits: SubmitLimits, known_models: Container[str]
) -> RowInput:
    """One ``{custom_id, params}`` of an Anthropic batch, as a row (module docstring)."""
    request = _object(index, request, "{custom_id, params}")
    for key in request:
        if key not in ("custom_id", "params"):
            known = "custom_id, params"
            raise _reject(index, str(key), f"is not a field of a request (fields: {known})")
    custom_id = _custom_id(index, request.get("custom_id"), anthropic=True)
    params = request.get("params")
    if type(params) is not dict:
        raise _reject(index, "params", "is required" if params is None else "must be an object")
    chat = _simple_translation(params)
    if chat is None:
        try:
            AnthropicParams.model_validate(params)
        except ValidationError as exc:
            field, message = first_error(exc, params)
            raise _reject(index, f"params.{field}" if field else "params", message) from None
        chat = _translate(params)
    return _chat_row(index, custom_id, chat, "params", limits, known_models)


_SIMPLE_PARAMS = frozenset({"model", "max_tokens", "messages", "system", "temperature", "top_p"})
_ANTHROPIC_ROLES = frozenset({"user", "assistant"})
_token_count = FAST_PARAMS["max_tokens"]
_unit = FAST_PARAMS["top_p"]  # Anthropic's temperature is 0 to 1 too


def _simple_translation(params: dict[str, Any]) -> dict[str, Any] | None:
    """The fast path of the common request, which :class:`AnthropicParams` always accepts:
    string turns of ``user``/``assistant``, a string ``system`` (or none), ``model``, and
    ``max_tokens``, ``temperature``, ``top_p`` in range; translated as :func:`_translate`
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


def _translate(params: dict[str, Any]) -> dict[str, Any]:
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


__all__ = ["anthropic_request_row", "check_unique_ids", "openai_line_row"]
