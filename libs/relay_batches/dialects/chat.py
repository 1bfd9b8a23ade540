"""A request row as a typed chat-completions request (pydantic v2), and its storage.

One set of models is the rule for every row, whatever the surface: :class:`RequestRow`
(a native ``requests[i]``), :class:`ChatRequest` (a dialect's translated request) and
:class:`~.chat_params.Params` (the job-level ``params``, the same parameters). Their
JSON Schemas are the OpenAPI document's ``RequestRow``, ``Message`` and ``Params``.

Models are strict (no coercion: ``"1"`` is not an integer) and refuse unknown keys with
a message listing the known ones (the plumbing is :mod:`.shapes`). :func:`check_row`
turns pydantic's first error into a :class:`~.validation.RowError`-shaped
``(field, message)`` whose field is the exact path inside the row
(``messages[0].content[1].text``), so every surface can name it. :func:`plain_messages`
and :func:`plain_params` are the one fast check of the common case (string messages,
scalar parameters) on every surface, a subset of what the models accept.
:func:`stored_request` applies the storage rule of ``batch_rows.request``.

The validation context carries the limits a row is checked against: ``max_bytes`` (a
message's content, text parts counted together, in UTF-8 bytes) and ``known_models``.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from typing import Annotated, Any, ClassVar, Literal

import orjson
from pydantic import (
    AfterValidator,
    Field,
    RootModel,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from relay_batches.dialects.chat_params import (
    MAX_CHOICES,
    MAX_STOP_CHARS,
    MAX_STOP_SEQUENCES,
    MAX_TOKENS_LIMIT,
    MAX_TOOLS,
    MAX_TOP_LOGPROBS,
    REASONING_EFFORTS,
    RESPONSE_FORMAT_TYPES,
    SEED_RANGE,
    SERVICE_TIERS,
    VERBOSITIES,
    FunctionDef,
    Params,
    ResponseFormat,
    Stop,
    StopText,
    Temperature,
    TokenCount,
    Tool,
    ToolChoiceFunction,
    TopP,
)
from relay_batches.dialects.shapes import (
    MAX_JSON_DEPTH,
    MAX_SCHEMA_BYTES,
    FreeObject,
    Shape,
    first_error,
    is_unicode,
    json_depth,
    tagged,
    tagged_by,
    unencodable_path,
)

# Re-exported: the rules of a row, and the plumbing its models are made of.
__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_SCHEMA_BYTES",
    "MAX_STOP_CHARS",
    "MAX_STOP_SEQUENCES",
    "MAX_TOKENS_LIMIT",
    "MAX_TOOLS",
    "RESPONSE_FORMAT_TYPES",
    "SEED_RANGE",
    "FreeObject",
    "FunctionDef",
    "Params",
    "ResponseFormat",
    "Shape",
    "Stop",
    "StopText",
    "Temperature",
    "TokenCount",
    "Tool",
    "ToolChoiceFunction",
    "TopP",
    "first_error",
    "is_unicode",
    "json_depth",
    "tagged",
    "tagged_by",
    "unencodable_path",
]

FAST_ROLES = frozenset({"system", "developer", "user", "assistant"})
ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_CUSTOM_ID_CHARS = 256
MAX_NAME_CHARS = 256
# Row fields besides the messages: what a chat request carries for the model.
PARAM_FIELDS = tuple(sorted(Params.FIELDS))


# --- content -----------------------------------------------------------------------


class TextPart(Shape):
    """A text content part."""

    NOUN: ClassVar[str] = "a text part"
    type: Literal["text"]
    text: str


class ImageUrl(Shape):
    """Where an image is: an http(s) URL or a ``data:`` URL."""

    NOUN: ClassVar[str] = "an image_url"
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(Shape):
    """An image content part."""

    NOUN: ClassVar[str] = "an image part"
    type: Literal["image_url"]
    image_url: ImageUrl


ContentPart = Annotated[
    Annotated[TextPart, tagged("text")] | Annotated[ImagePart, tagged("image_url")],
    tagged_by("type", ("text", "image_url"), non_object="text"),
]
TextContent = str | list[TextPart]
UserContent = str | Annotated[list[ContentPart], Field(min_length=1)]


def content_bytes(content: object) -> int:
    """UTF-8 bytes of a message's text: the string, or its text parts together."""
    if type(content) is str:
        return len(content.encode("utf-8", "replace"))
    if type(content) is list:
        return sum(
            len(p.text.encode("utf-8", "replace")) for p in content if isinstance(p, TextPart)
        )
    return 0


class _Message(Shape):
    """A message's content is at most ``RELAY_MAX_CONTENT_BYTES`` (default 1 MiB) of
    UTF-8, its text parts counted together."""

    NOUN: ClassVar[str] = "a message"
    name: Annotated[str, Field(max_length=MAX_NAME_CHARS)] | None = None

    @field_validator("content", check_fields=False)
    @classmethod
    def _content_fits(cls, content: Any, info: ValidationInfo) -> Any:
        limit = (info.context or {}).get("max_bytes")
        if limit is not None and content_bytes(content) > limit:
            raise PydanticCustomError("too_large", f"must be at most {limit} bytes of UTF-8")
        return content


class SystemMessage(_Message):
    """``role: system``: instructions."""

    NOUN: ClassVar[str] = "a system message"
    role: Literal["system"]
    content: TextContent


class DeveloperMessage(_Message):
    """``role: developer``: instructions (newer OpenAI models' name for system)."""

    NOUN: ClassVar[str] = "a developer message"
    role: Literal["developer"]
    content: TextContent


class UserMessage(_Message):
    """``role: user``: text or content parts (text, images)."""

    NOUN: ClassVar[str] = "a user message"
    role: Literal["user"]
    content: UserContent


class FunctionCall(Shape):
    """The function an assistant called; ``arguments`` is JSON text, as OpenAI sends it."""

    NOUN: ClassVar[str] = "a function call"
    name: str
    arguments: str


class ToolCall(Shape):
    """One call of an assistant message's ``tool_calls``."""

    NOUN: ClassVar[str] = "a tool call"
    id: str
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(_Message):
    """``role: assistant``: an earlier answer; ``content`` may be absent with tool calls."""

    NOUN: ClassVar[str] = "an assistant message"
    role: Literal["assistant"]
    content: TextContent | None = None
    tool_calls: Annotated[list[ToolCall], Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _says_something(self) -> AssistantMessage:
        if self.content is None and self.tool_calls is None:
            raise PydanticCustomError(
                "content_required", "is required unless tool_calls is given", {"field": "content"}
            )
        return self


class ToolMessage(_Message):
    """``role: tool``: the result of the assistant's tool call ``tool_call_id``."""

    NOUN: ClassVar[str] = "a tool message"
    role: Literal["tool"]
    content: TextContent
    tool_call_id: str


class Message(RootModel[Any]):
    """One chat message, told apart by its ``role``."""

    root: Annotated[
        Annotated[SystemMessage, tagged("system")]
        | Annotated[DeveloperMessage, tagged("developer")]
        | Annotated[UserMessage, tagged("user")]
        | Annotated[AssistantMessage, tagged("assistant")]
        | Annotated[ToolMessage, tagged("tool")],
        tagged_by("role", ROLES, non_object="user"),
    ]


class ChatRequest(Params):
    """A whole chat request: messages, an optional ``model`` alias, the parameters."""

    NOUN: ClassVar[str] = "a chat request"
    messages: Annotated[list[Message], Field(min_length=1)]
    model: str | None = Field(
        None, description="A known model alias for this row; absent or null: the job's model."
    )

    @field_validator("model")
    @classmethod
    def _known_model(cls, model: str | None, info: ValidationInfo) -> str | None:
        return known_model(model, info)


def known_model(model: str | None, info: ValidationInfo) -> str | None:
    """``model`` as given, if the validation context's ``known_models`` (when given)
    knows it: the rule of a row's ``model`` on every endpoint."""
    known = (info.context or {}).get("known_models")
    if model is not None and known is not None and model not in known:
        raise PydanticCustomError("unknown_model", f"{_quote(model)} is unknown{known_list(known)}")
    return model


LISTED_MODELS = 20  # aliases an unknown model's error lists before "… (N in all)"


def known_list(known_models: Container[str]) -> str:
    """``; known models: a, b`` (the first :data:`LISTED_MODELS`, then how many in all)
    when ``known_models`` can list its aliases (a ``names()`` method), else nothing: what
    an unknown model's error ends with, wherever the model is named."""
    names = getattr(known_models, "names", None)
    aliases: list[str] = sorted(names()) if callable(names) else []
    if not aliases:
        return ""
    shown = ", ".join(aliases[:LISTED_MODELS])
    more = f", … ({len(aliases)} in all: GET /v1/models)" if len(aliases) > LISTED_MODELS else ""
    return f"; known models: {shown}{more}"


def _custom_id(custom_id: str) -> str:
    if "\x00" in custom_id:  # Postgres text cannot hold NUL
        raise PydanticCustomError("nul", "must not contain NUL characters")
    if not is_unicode(custom_id):  # a lone surrogate: the ledger cannot store it
        raise PydanticCustomError("string_unicode", "must be valid Unicode text")
    return custom_id


class RequestRow(ChatRequest):
    """One element of ``requests`` of ``POST /v1/batches`` (and one ``.jsonl`` line)."""

    NOUN: ClassVar[str] = "a request"
    custom_id: (
        Annotated[
            str,
            Field(max_length=MAX_CUSTOM_ID_CHARS, json_schema_extra={"pattern": "^[^\\u0000]*$"}),
            AfterValidator(_custom_id),
        ]
        | None
    ) = Field(
        None,
        description="No NUL characters. Defaults (absent or null) to `row-<n>` by 1-based"
        " position. After defaulting, custom ids must be unique within the batch, else 400"
        " naming the duplicate.",
    )


def check_row(
    model: type[ChatRequest], data: object, max_bytes: int, known_models: Container[str]
) -> tuple[str, str] | None:
    """None if ``data`` is a valid ``model``; else its first error ``(field, message)``."""
    if type(data) is not dict:
        return "", "must be an object"
    context = {"max_bytes": max_bytes, "known_models": known_models}
    try:
        model.model_validate(data, context=context)
    except ValidationError as exc:
        return first_error(exc, data)
    return None


def check_params(data: object) -> tuple[str, str] | None:
    """None if ``data`` is a valid job-level ``params`` object; else its first error."""
    if type(data) is not dict:
        return "", "must be an object"
    try:
        Params.model_validate(data)
    except ValidationError as exc:
        return first_error(exc, data)
    return None


# --- storage -------------------------------------------------------------------------


def plain_messages(messages: object, max_bytes: int) -> bool:
    """The fast check of the common case: ``messages`` a non-empty list of exactly
    ``{role, content: str}`` (role system, developer, user or assistant), each content
    at most ``max_bytes`` of UTF-8, which the message models always accept. False only
    means "not this shape": the models then accept the messages or say why."""
    if type(messages) is not list or not messages:
        return False
    safe_chars = max_bytes // 4  # n code points are at most 4n bytes: no need to encode
    roles = FAST_ROLES
    for msg in messages:
        if type(msg) is not dict or len(msg) != 2:
            return False
        role = msg.get("role")
        content = msg.get("content")
        if type(role) is not str or role not in roles or type(content) is not str:
            return False
        if len(content) > safe_chars and len(content.encode("utf-8", "replace")) > max_bytes:
            return False
    return True


def _token_count(value: object) -> bool:
    return type(value) is int and 1 <= value <= MAX_TOKENS_LIMIT


def _seed(value: object) -> bool:
    return type(value) is int and SEED_RANGE[0] <= value <= SEED_RANGE[1]


def _number_to(high: int) -> Callable[[object], bool]:
    def check(value: object) -> bool:  # NaN and infinities fail the comparison
        return (type(value) is float or type(value) is int) and 0 <= value <= high

    return check


def _stop_text(value: object) -> bool:
    return type(value) is str and 0 < len(value) <= MAX_STOP_CHARS


def _integer_in(low: int, high: int) -> Callable[[object], bool]:
    def check(value: object) -> bool:
        return type(value) is int and low <= value <= high

    return check


def _penalty(value: object) -> bool:  # NaN and infinities fail the comparison
    return (type(value) is float or type(value) is int) and -2 <= value <= 2


def _flag(value: object) -> bool:
    return type(value) is bool


def _text(value: object) -> bool:
    return type(value) is str


def _one_of(values: tuple[str, ...]) -> Callable[[object], bool]:
    allowed = frozenset(values)
    return lambda value: type(value) is str and value in allowed


# The scalar parameters the fast check takes, each with the test the models apply to it.
FAST_PARAMS: Mapping[str, Callable[[object], bool]] = {
    "max_tokens": _token_count,
    "max_completion_tokens": _token_count,
    "seed": _seed,
    "temperature": _number_to(2),
    "top_p": _number_to(1),
    "stop": _stop_text,
    "n": _integer_in(1, MAX_CHOICES),
    "top_logprobs": _integer_in(0, MAX_TOP_LOGPROBS),
    "logprobs": _flag,
    "store": _flag,
    "parallel_tool_calls": _flag,
    "presence_penalty": _penalty,
    "frequency_penalty": _penalty,
    "user": _text,
    "safety_identifier": _text,
    "prompt_cache_key": _text,
    "reasoning_effort": _one_of(REASONING_EFFORTS),
    "verbosity": _one_of(VERBOSITIES),
    "service_tier": _one_of(SERVICE_TIERS),
}


def plain_params(request: Mapping[str, object], other: Container[str]) -> bool:
    """The fast check of a request's parameters: every key is in ``other`` (checked by
    the caller) or one of :data:`FAST_PARAMS` whose value the models always accept. False
    only means "not this shape"."""
    checks = FAST_PARAMS
    for key, value in request.items():
        if key in other:
            continue
        check = checks.get(key)
        if check is None or not check(value):
            return False
    return True


def is_plain(request: Mapping[str, object]) -> bool:
    """Only messages, each exactly ``{role, content: str}``: stored as the bare array."""
    messages = request.get("messages")
    return (
        request.keys() == {"messages"}
        and type(messages) is list
        and all(
            type(m) is dict and m.keys() == {"role", "content"} and type(m["content"]) is str
            for m in messages
        )
    )


def stored_request(request: Mapping[str, object]) -> str:
    """``batch_rows.request`` of a validated chat request: ``custom_id`` excluded and
    null fields left out (of the row and of its messages: null means absent), then the
    sorted-keys messages array when plain, else the sorted-keys object form
    ``{"messages": [...], "model"?: ..., ...}``."""
    kept = {k: v for k, v in request.items() if k != "custom_id" and v is not None}
    messages = kept["messages"]
    if type(messages) is list:
        kept["messages"] = [_without_nulls(m) for m in messages]
    value: object = kept["messages"] if is_plain(kept) else kept
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _without_nulls(message: object) -> object:
    if type(message) is not dict or None not in message.values():
        return message
    return {k: v for k, v in message.items() if v is not None}


def _quote(value: str, limit: int = 64) -> str:
    return repr(value if len(value) <= limit else value[:limit] + "…")
