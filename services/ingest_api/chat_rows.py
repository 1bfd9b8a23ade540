"""A request row as a typed chat-completions request (pydantic v2), and its storage.

One set of models is the rule for every row, whatever the surface: :class:`RequestRow`
(a native ``requests[i]``), :class:`ChatRequest` (a dialect's translated request) and
:class:`Params` (the job-level ``params``, the same parameters). Their JSON Schemas are
the OpenAPI document's ``RequestRow``, ``Message`` and ``Params`` (:func:`openapi_fragment`).

Models are strict (no coercion: ``"1"`` is not an integer) and refuse unknown keys with
a message listing the known ones. :func:`check_row` turns pydantic's first error into a
:class:`~.validation.RowError`-shaped ``(field, message)`` whose field is the exact path
inside the row (``messages[0].content[1].text``), so every surface can name it.
:func:`stored_request` applies the storage rule of ``batch_rows.request``.

The validation context carries the limits a row is checked against: ``max_bytes`` (a
message's content, text parts counted together, in UTF-8 bytes) and ``known_models``.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from typing import Annotated, Any, ClassVar, Literal

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    RootModel,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

BAD_TAG = "bad_tag:"
# A union member's tag, as it appears in an error's location: marked so that no JSON key
# of the input can be mistaken for it (see error_field_and_message).
TAG_MARK = "="
FAST_ROLES = frozenset({"system", "developer", "user", "assistant"})
ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_TOOLS = 128
MAX_CUSTOM_ID_CHARS = 256
MAX_TOKENS_LIMIT = 1_000_000
MAX_STOP_SEQUENCES = 4
MAX_STOP_CHARS = 256
MAX_SCHEMA_BYTES = 64 * 1024  # a free-form object (a JSON Schema), compact JSON
MAX_JSON_DEPTH = 32  # nesting of a free-form object: ``{}`` is 1, ``{"a": []}`` is 2
SEED_RANGE = (-(2**63), 2**63 - 1)
MAX_NAME_CHARS = 256
# Row fields besides the messages: what a chat request carries for the model.
PARAM_FIELDS = (
    "max_completion_tokens",
    "max_tokens",
    "response_format",
    "seed",
    "stop",
    "temperature",
    "tool_choice",
    "tools",
    "top_p",
)


class Shape(BaseModel):
    """A JSON object of the API: strict, no unknown keys (each named with the known)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    # What the object is, for "is not a field of <NOUN>"; reasons for keys that are known
    # elsewhere but cannot be honoured here.
    NOUN: ClassVar[str] = "this object"
    UNSUPPORTED: ClassVar[Mapping[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if type(data) is dict:
            for key in data:
                if key not in cls.model_fields:
                    raise _unknown_key(cls, key)
        return data


def _unknown_key(cls: type[Shape], key: object) -> PydanticCustomError:
    reason = cls.UNSUPPORTED.get(key) if type(key) is str else None
    if reason is not None:
        return PydanticCustomError("unsupported", reason, {"field": key})
    known = ", ".join(sorted(cls.model_fields))
    return PydanticCustomError(
        "unknown_key", f"is not a field of {cls.NOUN} (fields: {known})", {"field": key}
    )


def tagged_by(key: str, tags: tuple[str, ...], non_object: str | None = None) -> Discriminator:
    """A discriminator on ``key``: a missing or unknown tag is one error on ``key`` naming
    the tags; a value that is not an object goes to the ``non_object`` member (whose own
    error says "must be an object"), or is that same error when None."""

    def tag(value: Any) -> str | None:
        if type(value) is not dict:
            return None if non_object is None else TAG_MARK + non_object
        found = value.get(key)
        return TAG_MARK + found if type(found) is str and found in tags else None

    return Discriminator(
        tag,
        # The error's type names the key (a context dict would make the type unhashable).
        custom_error_type=f"{BAD_TAG}{key}",
        custom_error_message=f"must be one of {', '.join(tags)}",
    )


def tagged(name: str) -> Tag:
    """The ``Tag`` of the union member chosen by a :func:`tagged_by` value ``name``."""
    return Tag(TAG_MARK + name)


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


# --- parameters ----------------------------------------------------------------------


def json_depth(value: object) -> int:
    """How deeply ``value`` nests objects and arrays (a scalar is 0, ``[]`` is 1)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if type(item) is dict:
            children: Iterable[object] = item.values()
        elif type(item) is list:
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _bounded(value: dict[str, Any]) -> dict[str, Any]:
    # Stored free-form JSON is echoed by every listing: orjson refuses to encode past 255
    # levels, so a deep value would otherwise break each page that holds it.
    if json_depth(value) > MAX_JSON_DEPTH:
        raise PydanticCustomError(
            "too_deep", f"must nest at most {MAX_JSON_DEPTH} levels of objects and arrays"
        )
    try:
        size = len(orjson.dumps(value))
    except TypeError:  # lone surrogates: only from a payload not built by orjson
        raise PydanticCustomError("not_json", "must be valid Unicode JSON") from None
    if size > MAX_SCHEMA_BYTES:
        raise PydanticCustomError("too_large", f"must be at most {MAX_SCHEMA_BYTES} bytes")
    return value


FreeObject = Annotated[dict[str, Any], AfterValidator(_bounded)]


def ranged(low: int, high: int, what: str) -> tuple[Any, ...]:
    """Annotations of a number from ``low`` to ``high`` (``what``: "a number", "an
    integer"), documented as the schema's minimum and maximum, one message for both."""

    def check(value: float) -> float:
        if not low <= value <= high:
            raise PydanticCustomError("range", f"must be {what} from {low} to {high}")
        return value

    bounds: dict[str, Any] = {"minimum": low, "maximum": high}
    return Field(json_schema_extra=bounds, allow_inf_nan=False), AfterValidator(check)


Temperature = Annotated[float, *ranged(0, 2, "a number")]
TopP = Annotated[float, *ranged(0, 1, "a number")]
TokenCount = Annotated[int, *ranged(1, MAX_TOKENS_LIMIT, "an integer")]
Seed = Annotated[int, *ranged(*SEED_RANGE, "an integer")]
StopText = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
Stop = StopText | Annotated[list[StopText], Field(min_length=1, max_length=MAX_STOP_SEQUENCES)]


class FunctionDef(Shape):
    """A function the model may call; ``parameters`` is its JSON Schema."""

    NOUN: ClassVar[str] = "a function"
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")]
    description: str | None = None
    parameters: FreeObject | None = None
    strict: bool | None = None


class Tool(Shape):
    """One entry of ``tools``: only function tools."""

    NOUN: ClassVar[str] = "a tool"
    type: Literal["function"]
    function: FunctionDef


class FunctionName(Shape):
    """The function a ``tool_choice`` forces."""

    NOUN: ClassVar[str] = "a tool_choice function"
    name: str


class ToolChoiceFunction(Shape):
    """``tool_choice`` forcing one function."""

    NOUN: ClassVar[str] = "a tool_choice"
    type: Literal["function"]
    function: FunctionName


class TextFormat(Shape):
    """``response_format: {type: text}``."""

    NOUN: ClassVar[str] = "a text response_format"
    type: Literal["text"]


class JsonObjectFormat(Shape):
    """``response_format: {type: json_object}``."""

    NOUN: ClassVar[str] = "a json_object response_format"
    type: Literal["json_object"]


class JsonSchemaFormat(Shape):
    """``response_format: {type: json_schema, json_schema: {name, schema, strict?}}``."""

    NOUN: ClassVar[str] = "a json_schema response_format"
    type: Literal["json_schema"]
    json_schema: FreeObject


RESPONSE_FORMAT_TYPES = ("json_object", "json_schema", "text")
ResponseFormat = Annotated[
    Annotated[TextFormat, tagged("text")]
    | Annotated[JsonObjectFormat, tagged("json_object")]
    | Annotated[JsonSchemaFormat, tagged("json_schema")],
    tagged_by("type", RESPONSE_FORMAT_TYPES),
]


class Params(Shape):
    """The model parameters of a chat request: the job's ``params``, and a row's own."""

    NOUN: ClassVar[str] = "params"
    temperature: Temperature | None = None
    top_p: TopP | None = None
    max_tokens: TokenCount | None = None
    max_completion_tokens: TokenCount | None = None
    seed: Seed | None = None
    stop: Stop | None = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Tool], Field(min_length=1, max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None


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
        known = (info.context or {}).get("known_models")
        if model is not None and known is not None and model not in known:
            raise PydanticCustomError("unknown_model", f"{_quote(model)} is unknown")
        return model


def _custom_id(custom_id: str) -> str:
    if "\x00" in custom_id:  # Postgres text cannot hold NUL
        raise PydanticCustomError("nul", "must not contain NUL characters")
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


# --- errors --------------------------------------------------------------------------

_PHRASES = {
    "missing": "is required",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be a boolean",
    "list_type": "must be an array",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "none_required": "must be null",
}


def error_field_and_message(error: ErrorDetails, data: object) -> tuple[str, str]:
    """The path (``messages[0].content``) and message (``must be a string``) of a
    pydantic error on ``data``; the path follows the input, skipping union tags."""
    path = ""
    node: object = data
    loc = error["loc"]
    ctx = error.get("ctx") or {}
    for n, step in enumerate(loc):
        if type(node) is dict and type(step) is str and step in node:
            path, node = f"{path}.{step}", node[step]
        elif type(node) is list and type(step) is int:
            path, node = f"{path}[{step}]", node[step]
        elif n == len(loc) - 1 and error["type"] == "missing" and type(step) is str:
            path = f"{path}.{step}"
    field = ctx.get("field") or error["type"].partition(BAD_TAG)[2]
    if field:
        path = f"{path}.{field}"
    return path.lstrip("."), _phrase(error)


def _phrase(error: ErrorDetails) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind in _PHRASES:
        return _PHRASES[kind]
    if kind == "literal_error":
        return f"must be {ctx.get('expected', 'one of the allowed values')}"
    if kind == "too_short":
        return "must be a non-empty array"
    if kind == "too_long":
        return f"must hold at most {ctx.get('max_length')} items"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters"
    if kind == "greater_than_equal":
        return f"must be at least {ctx.get('ge')}"
    if kind == "less_than_equal":
        return f"must be at most {ctx.get('le')}"
    if kind == "finite_number":
        return "must be a finite number"
    if kind == "string_pattern_mismatch":
        return f"must match {ctx.get('pattern')}"
    return error["msg"]


def first_error(exc: ValidationError, data: object) -> tuple[str, str]:
    """The error to report of all pydantic found: the deepest (a union's other members
    fail at the union itself), the first of those."""
    found = [
        (error_field_and_message(e, data), e["type"].endswith("_type"))
        for e in exc.errors(include_url=False)
    ]
    # Deepest first; at one depth, a member that took the value's type says more than
    # one that did not ("at most 4 items" rather than "must be a string").
    best = max(found, key=lambda f: (f[0][0].count(".") + f[0][0].count("["), not f[1]))
    return best[0]


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


# --- OpenAPI -------------------------------------------------------------------------


def openapi_fragment() -> dict[str, dict[str, Any]]:
    """``RequestRow``, ``Message``, ``Params`` and what they use, for the served document."""
    # Imported here: openapi.py lists this function among its fragments.
    from relay_batches.services.ingest_api.openapi import model_schemas

    return {"schemas": model_schemas(RequestRow, Message, Params)}
