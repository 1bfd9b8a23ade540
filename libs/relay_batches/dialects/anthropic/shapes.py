"""The shapes of Anthropic's Message Batches API, as pydantic models: the Messages
parameters a batch request carries, and the objects the Anthropic-compatible surface
answers.

Written once: the surface validates requests and builds its answers from them (or, for
the results lines, plain dicts of exactly these shapes, checked against them by the
tests) and its OpenAPI document takes its schemas from them. Field names, types
and literals follow Anthropic's Message Batches API, so the official SDK's own types
validate every object. Class names carry an ``Anthropic`` prefix: they are the schema
names in the one document every surface shares.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from relay_batches.dialects.chat import StopText, TokenCount, TopP
from relay_batches.dialects.shapes import FreeObject, NestedObject, Shape, tagged, tagged_by

CUSTOM_ID_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
_NOT_TRANSLATED = "cannot be translated to a chat request (Relay runs rows on any provider)"
ProcessingStatus = Literal["in_progress", "canceling", "ended"]
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal"]
# The error types of Anthropic's error object (its SDK's ErrorObject union).
ErrorType = Literal[
    "invalid_request_error",
    "authentication_error",
    "billing_error",
    "permission_error",
    "not_found_error",
    "rate_limit_error",
    "timeout_error",
    "api_error",
    "overloaded_error",
    "request_too_large",
]


# --- requests: the Messages API parameters of one batch request ---------------------

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


# --- answers ---------------------------------------------------------------------------


class _Response(BaseModel):
    """A response shape: every field is always sent (``null`` when unset)."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=True)


# --- requests ------------------------------------------------------------------------


class AnthropicBatchRequest(BaseModel):
    """One request of a batch: the caller's id and Messages API parameters (``model`` a
    Relay alias), translated into a row by :func:`.row_formats.anthropic_request_row`."""

    model_config = ConfigDict(extra="forbid")

    custom_id: Annotated[str, Field(pattern=CUSTOM_ID_PATTERN)]
    params: AnthropicParams


class AnthropicCreateBatch(BaseModel):
    """The body of ``POST /anthropic/v1/messages/batches`` (documented by this model;
    scanned request by request by the ingest-api's Anthropic surface)."""

    model_config = ConfigDict(extra="forbid")

    requests: Annotated[list[AnthropicBatchRequest], Field(min_length=1)]


# --- the batch -----------------------------------------------------------------------


class AnthropicRequestCounts(_Response):
    """How many requests are in each state; they always add up to the batch's total."""

    processing: int
    succeeded: int
    errored: int
    canceled: int
    expired: int


class AnthropicMessageBatch(_Response):
    """A Message Batch: one Relay job seen through the Anthropic surface."""

    id: str = Field(description="`msgbatch_` and the job's 32-hex id.")
    type: Literal["message_batch"] = "message_batch"
    processing_status: ProcessingStatus
    request_counts: AnthropicRequestCounts
    created_at: datetime
    expires_at: datetime
    ended_at: datetime | None = None
    cancel_initiated_at: datetime | None = None
    archived_at: datetime | None = None
    results_url: str | None = Field(
        default=None, description="Where the results are, once the batch has ended."
    )


class AnthropicMessageBatchList(_Response):
    """A page of batches, newest first."""

    data: list[AnthropicMessageBatch]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None


class AnthropicDeletedMessageBatch(_Response):
    """The answer to a delete."""

    id: str
    type: Literal["message_batch_deleted"] = "message_batch_deleted"


class AnthropicErrorDetail(_Response):
    """The inner error: its type and a message naming the field where there is one."""

    type: ErrorType
    message: str


class AnthropicError(_Response):
    """Anthropic's error object, on this surface for every failure."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail


# --- the results ---------------------------------------------------------------------


class AnthropicResultText(_Response):
    """Text the model answered."""

    type: Literal["text"] = "text"
    text: str


class AnthropicResultToolUse(_Response):
    """A tool the model called, with its arguments as an object."""

    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class AnthropicResultUsage(_Response):
    """Tokens of the row's request and answer."""

    input_tokens: int
    output_tokens: int


class AnthropicResultMessage(_Response):
    """A Messages API message, built from the row's stored outcome."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[
        Annotated[AnthropicResultText | AnthropicResultToolUse, Field(discriminator="type")]
    ]
    stop_reason: StopReason
    stop_sequence: str | None = None
    usage: AnthropicResultUsage


class AnthropicSucceededResult(_Response):
    """The row was answered."""

    type: Literal["succeeded"] = "succeeded"
    message: AnthropicResultMessage


class AnthropicErroredResult(_Response):
    """The row failed on every deployment (or its batch failed before it ran)."""

    type: Literal["errored"] = "errored"
    error: AnthropicError


class AnthropicCanceledResult(_Response):
    """The batch was canceled before the row ran."""

    type: Literal["canceled"] = "canceled"


class AnthropicExpiredResult(_Response):
    """The batch expired before the row ran."""

    type: Literal["expired"] = "expired"


AnthropicResult = Annotated[
    AnthropicSucceededResult
    | AnthropicErroredResult
    | AnthropicCanceledResult
    | AnthropicExpiredResult,
    Field(discriminator="type"),
]


class AnthropicResultLine(_Response):
    """One line of a batch's results (``.jsonl``), in request order."""

    custom_id: str
    result: AnthropicResult
