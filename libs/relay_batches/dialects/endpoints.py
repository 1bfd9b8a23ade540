"""The OpenAI endpoints Relay runs besides chat completions, one request model each.

Each endpoint's body is a strict pydantic model (an unknown key is a 400 naming its
path, as for chat rows): :class:`EmbeddingsRequest` (``/v1/embeddings``),
:class:`CompletionsRequest` (``/v1/completions``), :class:`ModerationsRequest`
(``/v1/moderations``) and :class:`ResponsesRequest` (``/v1/responses``). A row of such a
job is its endpoint's body, its ``model`` optional (the job's alias when absent), plus
``custom_id`` on the native surface.

Storage (``batch_rows.request``): the body's non-null fields with ``"endpoint"`` added,
sorted keys (:func:`stored_body`); a chat row stays as :mod:`.chat` stores it, without
the key. The worker reads the endpoint back from the row (:func:`endpoint_of`).

Answers: the provider's JSON body is the row's content, as it came (:func:`body_reply`);
its usage counts as the row's tokens (``prompt_tokens``/``completion_tokens``, or
``input_tokens``/``output_tokens`` for Responses; a moderation has none).
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

import orjson
from pydantic import AfterValidator, Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from relay_batches.dialects.chat import MAX_CUSTOM_ID_CHARS, known_model
from relay_batches.dialects.chat_params import Seed, Stop, TokenCount, TopP
from relay_batches.dialects.shapes import (
    FreeObject,
    NestedObject,
    Shape,
    first_error,
    is_unicode,
    ranged,
)
from relay_batches.ratelimit.estimate import estimate_tokens
from relay_batches.router.types import ProviderReply, reply_with_usage

CHAT = "/v1/chat/completions"
EMBEDDINGS = "/v1/embeddings"
COMPLETIONS = "/v1/completions"
MODERATIONS = "/v1/moderations"
RESPONSES = "/v1/responses"
ENDPOINT_KEY = "endpoint"  # the key a stored non-chat row carries its endpoint under
MAX_INPUTS = 2048  # items of an embeddings input array (OpenAI's limit)
MAX_DIMENSIONS = 65_536

Temperature = Annotated[float, *ranged(0, 2, "a number")]
Penalty = Annotated[float, *ranged(-2, 2, "a number")]
NonEmptyText = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[int], Field(min_length=1)]
TextOrTokens = (
    str
    | Annotated[list[str], Field(min_length=1, max_length=MAX_INPUTS)]
    | TokenIds
    | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_INPUTS)]
)


class _Body(Shape):
    """What every endpoint's body has: an optional ``model`` alias (the job's when
    absent), checked against the known aliases of the validation context."""

    model: str | None = Field(
        None, description="A known model alias for this row; absent or null: the job's model."
    )

    @field_validator("model")
    @classmethod
    def _known_model(cls, model: str | None, info: ValidationInfo) -> str | None:
        return known_model(model, info)


class EmbeddingsRequest(_Body):
    """A ``/v1/embeddings`` body: ``input`` text, texts or token arrays."""

    NOUN: ClassVar[str] = "an embeddings request"
    input: TextOrTokens
    dimensions: Annotated[int, *ranged(1, MAX_DIMENSIONS, "an integer")] | None = None
    encoding_format: Literal["float", "base64"] | None = None
    user: str | None = None


class CompletionsRequest(_Body):
    """A ``/v1/completions`` (legacy text completions) body."""

    NOUN: ClassVar[str] = "a completions request"
    prompt: TextOrTokens
    suffix: str | None = None
    max_tokens: TokenCount | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: Annotated[int, *ranged(1, 128, "an integer")] | None = None
    best_of: Annotated[int, *ranged(1, 20, "an integer")] | None = None
    stop: Stop | None = None
    seed: Seed | None = None
    echo: bool | None = None
    logprobs: Annotated[int, *ranged(0, 5, "an integer")] | None = None
    logit_bias: dict[str, int] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    stream: Literal[False] | None = None
    user: str | None = None


class ModerationsRequest(_Body):
    """A ``/v1/moderations`` body: ``input`` text, texts or multimodal parts."""

    NOUN: ClassVar[str] = "a moderations request"
    input: (
        str
        | Annotated[list[str], Field(min_length=1)]
        | Annotated[list[NestedObject], Field(min_length=1)]
    )


class ResponsesRequest(_Body):
    """A ``/v1/responses`` body: ``input`` text or input items; items, tools, ``text``
    and ``reasoning`` are passed on as they are (their shape is the provider's)."""

    NOUN: ClassVar[str] = "a responses request"
    input: str | Annotated[list[NestedObject], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: TokenCount | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    tools: list[FreeObject] | None = None
    tool_choice: str | FreeObject | None = None
    parallel_tool_calls: bool | None = None
    text: NestedObject | None = None
    reasoning: NestedObject | None = None
    metadata: dict[str, str] | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    store: bool | None = None
    stream: Literal[False] | None = None
    background: Literal[False] | None = None
    previous_response_id: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    top_logprobs: Annotated[int, *ranged(0, 20, "an integer")] | None = None
    user: str | None = None


def _custom_id(custom_id: str) -> str:
    if "\x00" in custom_id:  # Postgres text cannot hold NUL
        raise PydanticCustomError("nul", "must not contain NUL characters")
    if not is_unicode(custom_id):
        raise PydanticCustomError("string_unicode", "must be valid Unicode text")
    return custom_id


CustomId = Annotated[str, Field(max_length=MAX_CUSTOM_ID_CHARS), AfterValidator(_custom_id)] | None


class EmbeddingsRow(EmbeddingsRequest):
    """One native ``requests[i]`` of an embeddings job."""

    custom_id: CustomId = None


class CompletionsRow(CompletionsRequest):
    """One native ``requests[i]`` of a completions job."""

    custom_id: CustomId = None


class ModerationsRow(ModerationsRequest):
    """One native ``requests[i]`` of a moderations job."""

    custom_id: CustomId = None


class ResponsesRow(ResponsesRequest):
    """One native ``requests[i]`` of a responses job."""

    custom_id: CustomId = None


@dataclass(frozen=True)
class Endpoint:
    """One endpoint besides chat: its body model, its native row model and the keys of
    its answer's usage (None: it reports none)."""

    path: str
    body: type[_Body]
    row: type[_Body]
    usage: tuple[str, str] | None


ENDPOINTS: Mapping[str, Endpoint] = {
    EMBEDDINGS: Endpoint(
        EMBEDDINGS, EmbeddingsRequest, EmbeddingsRow, ("prompt_tokens", "completion_tokens")
    ),
    COMPLETIONS: Endpoint(
        COMPLETIONS, CompletionsRequest, CompletionsRow, ("prompt_tokens", "completion_tokens")
    ),
    MODERATIONS: Endpoint(MODERATIONS, ModerationsRequest, ModerationsRow, None),
    RESPONSES: Endpoint(
        RESPONSES, ResponsesRequest, ResponsesRow, ("input_tokens", "output_tokens")
    ),
}
ALL_ENDPOINTS = (CHAT, *ENDPOINTS)  # every endpoint a batch may name


def check_body(
    endpoint: str, data: object, known_models: Container[str], *, row: bool = False
) -> tuple[str, str] | None:
    """None if ``data`` is a valid body (``row``: native row) of ``endpoint``; else its
    first error ``(field, message)``, the field the path inside ``data``."""
    if type(data) is not dict:
        return "", "must be an object"
    spec = ENDPOINTS[endpoint]
    try:
        (spec.row if row else spec.body).model_validate(
            data, context={"known_models": known_models}
        )
    except ValidationError as exc:
        return first_error(exc, data)
    return None


def stored_body(endpoint: str, body: Mapping[str, Any]) -> str:
    """``batch_rows.request`` of a validated body: its non-null fields but ``custom_id``,
    with the endpoint, sorted keys (raises TypeError on a lone surrogate)."""
    kept = {k: v for k, v in body.items() if k != "custom_id" and v is not None}
    kept[ENDPOINT_KEY] = endpoint
    return orjson.dumps(kept, option=orjson.OPT_SORT_KEYS).decode()


def endpoint_of(fields: dict[str, Any]) -> str:
    """Pop a decoded stored row's endpoint off ``fields`` (chat when it names none)."""
    endpoint = fields.pop(ENDPOINT_KEY, None)
    return endpoint if isinstance(endpoint, str) else CHAT


def body_reply(endpoint: str, raw: bytes) -> ProviderReply:
    """A 200 reply of ``endpoint``: the body as the row's content (it must be a JSON
    object), its usage as the row's tokens; anything else a malformed reply."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        return ProviderReply(error="malformed response from upstream")
    keys = ENDPOINTS[endpoint].usage
    prompt_key, completion_key = keys if keys is not None else ("", "")
    return reply_with_usage(
        raw.decode("utf-8", "replace"),
        data.get("usage"),
        prompt_key,
        completion_key,
        model=data.get("model"),
    )


# An answer's ``object`` → the endpoint that gives it (a moderation has none: its
# ``results`` tell it).
ANSWER_OBJECTS = {
    "chat.completion": CHAT,
    "list": EMBEDDINGS,
    "text_completion": COMPLETIONS,
    "response": RESPONSES,
}


def answer_endpoint(body: Mapping[str, Any]) -> str:
    """The endpoint whose answer ``body`` is (a provider batch's result line tells only
    this way): by its ``object``, a moderation by its ``results``; chat otherwise."""
    endpoint = ANSWER_OBJECTS.get(body.get("object"))  # type: ignore[arg-type]
    if endpoint is None:
        return MODERATIONS if "results" in body else CHAT
    return endpoint


def input_estimate(endpoint: str, body: Mapping[str, Any], cap: int) -> int:
    """The tokens a call of ``body`` is expected to count against a tokens-per-minute
    limit: its input text (:func:`input_texts`) plus the completion cap it sends."""
    texts = input_texts(endpoint, body)
    return estimate_tokens([{"content": text} for text in texts], {}, cap)


def input_texts(endpoint: str, body: Mapping[str, Any]) -> list[str]:
    """The text a body sends (for a token estimate): its ``input``/``prompt`` strings,
    ``instructions``, and the JSON of anything else it inputs."""
    value = body.get("prompt" if endpoint == COMPLETIONS else "input")
    texts = [value] if isinstance(value, str) else []
    if isinstance(value, list):
        texts = [v if isinstance(v, str) else orjson.dumps(v).decode() for v in value]
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        texts.append(instructions)
    return texts
