"""The parameters of a chat-completions request (pydantic v2): :class:`Params`.

Every field of OpenAI's current ``POST /v1/chat/completions`` request besides
``messages`` and ``model`` is known here, with OpenAI's types and bounds, so a row (or a
job's ``params``) carrying any of them is accepted, and an unknown key is still a 400
naming its path. Relay does not judge whether a model can honour a parameter: a
deployment that speaks the OpenAI API gets the row's fields as they came
(:mod:`relay_batches.dialects.openai.upstream`), and a deployment that cannot take one
(the Anthropic Messages translation cannot take ``logit_bias``, ``n`` above 1, …) fails
that row on that deployment naming the parameter, so the row falls through to the
alias's next deployment (:mod:`relay_batches.router.router`).

Two fields cannot be honoured by a batch at all and stay refused: ``stream`` other than
``false`` (batch rows are not streamed) and ``stream_options`` (only for streamed
replies: OpenAI refuses it without ``stream: true``).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from relay_batches.dialects.shapes import FreeObject, Shape, ranged, tagged, tagged_by

MAX_TOOLS = 128
MAX_TOKENS_LIMIT = 1_000_000
MAX_STOP_SEQUENCES = 4
MAX_STOP_CHARS = 256
SEED_RANGE = (-(2**63), 2**63 - 1)
MAX_CHOICES = 128  # OpenAI's bound on ``n``
MAX_TOP_LOGPROBS = 20
LOGIT_BIAS_RANGE = (-100, 100)
MAX_LOGIT_BIAS = 1024  # entries of logit_bias (OpenAI states no bound; rows stay small)
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
MAX_MODALITIES = 2
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority", "fast")
VERBOSITIES = ("low", "medium", "high")
AUDIO_FORMATS = ("wav", "aac", "mp3", "flac", "opus", "pcm16")
NOT_STREAMED = "batch rows are not streamed"


Temperature = Annotated[float, *ranged(0, 2, "a number")]
TopP = Annotated[float, *ranged(0, 1, "a number")]
Penalty = Annotated[float, *ranged(-2, 2, "a number")]
TokenCount = Annotated[int, *ranged(1, MAX_TOKENS_LIMIT, "an integer")]
Seed = Annotated[int, *ranged(*SEED_RANGE, "an integer")]
Choices = Annotated[int, *ranged(1, MAX_CHOICES, "an integer")]
TopLogprobs = Annotated[int, *ranged(0, MAX_TOP_LOGPROBS, "an integer")]
Bias = Annotated[int, *ranged(*LOGIT_BIAS_RANGE, "an integer")]
StopText = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
Stop = StopText | Annotated[list[StopText], Field(min_length=1, max_length=MAX_STOP_SEQUENCES)]


def _token_ids(bias: dict[str, int]) -> dict[str, int]:
    if not all(key.isascii() and key.isdigit() for key in bias):
        raise PydanticCustomError("token_id", "keys must be token ids (decimal digits)")
    return bias


LogitBias = Annotated[
    dict[str, Bias],
    Field(max_length=MAX_LOGIT_BIAS, json_schema_extra={"propertyNames": {"pattern": "^[0-9]+$"}}),
    AfterValidator(_token_ids),
]
Metadata = Annotated[
    dict[
        Annotated[str, Field(max_length=MAX_METADATA_KEY_CHARS)],
        Annotated[str, Field(max_length=MAX_METADATA_VALUE_CHARS)],
    ],
    Field(max_length=MAX_METADATA_PAIRS),
]


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
    """The function a ``tool_choice`` (or the deprecated ``function_call``) forces."""

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


class VoiceId(Shape):
    """A custom voice: ``{id}``."""

    NOUN: ClassVar[str] = "a voice"
    id: str


class Audio(Shape):
    """``audio``: the voice and format of an audio answer (with ``modalities: [audio]``)."""

    NOUN: ClassVar[str] = "audio"
    format: Literal["wav", "aac", "mp3", "flac", "opus", "pcm16"]
    voice: str | VoiceId


class PredictionText(Shape):
    """A text part of a predicted output."""

    NOUN: ClassVar[str] = "a prediction text part"
    type: Literal["text"]
    text: str


class Prediction(Shape):
    """``prediction``: content the answer is expected to largely repeat."""

    NOUN: ClassVar[str] = "a prediction"
    type: Literal["content"]
    content: str | Annotated[list[PredictionText], Field(min_length=1)]


class StreamOptions(Shape):
    """``stream_options``: documented, never accepted (batch rows are not streamed)."""

    NOUN: ClassVar[str] = "stream_options"
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class ApproximateLocation(Shape):
    """Where the user roughly is, for web search."""

    NOUN: ClassVar[str] = "an approximate location"
    city: str | None = None
    country: str | None = None
    region: str | None = None
    timezone: str | None = None


class UserLocation(Shape):
    """``web_search_options.user_location``."""

    NOUN: ClassVar[str] = "a user_location"
    type: Literal["approximate"]
    approximate: ApproximateLocation


class WebSearchOptions(Shape):
    """``web_search_options``: search the web before answering (search models)."""

    NOUN: ClassVar[str] = "web_search_options"
    search_context_size: Literal["low", "medium", "high"] | None = None
    user_location: UserLocation | None = None


class ModerationMode(Shape):
    """How moderation treats one side of the exchange."""

    NOUN: ClassVar[str] = "a moderation policy"
    mode: Literal["score", "block"]


class ModerationPolicy(Shape):
    """``moderation.policy``: the input's and the output's modes."""

    NOUN: ClassVar[str] = "a moderation policy"
    input: ModerationMode | None = None
    output: ModerationMode | None = None


class Moderation(Shape):
    """``moderation``: run a moderation model on the request and the answer."""

    NOUN: ClassVar[str] = "moderation"
    model: str
    policy: ModerationPolicy | None = None


class PromptCacheOptions(Shape):
    """``prompt_cache_options``: how the provider caches the prompt."""

    NOUN: ClassVar[str] = "prompt_cache_options"
    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m"] | None = None


def _unstreamed(value: bool | None) -> bool | None:
    if value is True:
        raise PydanticCustomError("streamed", f"must be false: {NOT_STREAMED}")
    return value


def _not_streamed(value: Any) -> Any:
    if value is not None:
        raise PydanticCustomError("streamed", f"is only for streamed replies: {NOT_STREAMED}")
    return value


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
    parallel_tool_calls: bool | None = None
    n: Choices | None = Field(
        None, description="Choices to generate; every choice is returned (see Results)."
    )
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    logit_bias: LogitBias | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    metadata: Metadata | None = None
    store: bool | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast"] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = (
        None
    )
    verbosity: Literal["low", "medium", "high"] | None = None
    modalities: (
        Annotated[list[Literal["text", "audio"]], Field(min_length=1, max_length=MAX_MODALITIES)]
        | None
    ) = None
    audio: Audio | None = None
    prediction: Prediction | None = None
    web_search_options: WebSearchOptions | None = None
    moderation: Moderation | None = None
    functions: Annotated[list[FunctionDef], Field(min_length=1, max_length=MAX_TOOLS)] | None = (
        Field(None, description="Deprecated by OpenAI in favour of `tools`.")
    )
    function_call: Literal["none", "auto"] | FunctionName | None = Field(
        None, description="Deprecated by OpenAI in favour of `tool_choice`."
    )
    stream: Annotated[bool | None, AfterValidator(_unstreamed)] = Field(
        None, description=f"Only false: {NOT_STREAMED}."
    )
    stream_options: Annotated[StreamOptions | None, AfterValidator(_not_streamed)] = Field(
        None, description=f"Refused: {NOT_STREAMED}."
    )
