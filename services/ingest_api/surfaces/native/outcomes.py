"""The native surface's shapes of what a batch's rows and webhook came to: result rows and
dead letters, the stats, the webhook delivery log, the model list and the service
endpoints' answers (pydantic models for the OpenAPI schemas, as :mod:`.shapes`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, RootModel, Tag

from relay_batches.ledger.job_stats import LATENCY_BOUNDS_MS, MAX_INTERVALS
from relay_batches.model import DeliveryStatus
from relay_batches.services.ingest_api.surfaces.native.shapes import (
    ABSENT,
    Closed,
    Count,
    Id,
    Status,
    Timestamp,
    enum,
)

_DETAILS = "With `include=details`"


class _Function(BaseModel):
    name: str
    arguments: str


class _ToolCall(BaseModel):
    id: str
    type: Literal["function"]
    function: _Function


class _RowUsage(Closed):
    prompt_tokens: Count
    completion_tokens: Count


def _details_last(schema: dict[str, Any]) -> None:
    """A row's own properties first, then the details (which pydantic puts first: they are
    the base class's)."""
    properties = schema.get("properties", {})
    details = [name for name in _RowDetails.model_fields if name in properties]
    schema["properties"] = {
        **{k: v for k, v in properties.items() if k not in details},
        **{k: properties[k] for k in details},
    }


class _RowDetails(Closed):
    """What every result row carries with `include=details`."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_details_last)

    usage: _RowUsage = Field(ABSENT, description=f"{_DETAILS}: the row's tokens.")
    deployment: str | None = Field(
        None,
        description=f"{_DETAILS}: the routes-file deployment that answered; null for an error"
        " (its text names the deployment that failed last).",
    )
    latency_ms: int | None = Field(
        None,
        ge=0,
        description=f"{_DETAILS}: the row's time in the model router, attempts and backoff"
        " included; null if unknown.",
    )
    finish_reason: str | None = Field(
        None,
        description=f"{_DETAILS}: why the model stopped (`stop`, `length`, `tool_calls`,"
        " `content_filter`); null for an error or when not reported.",
    )
    cost_usd: float = Field(
        ABSENT,
        ge=0,
        description=f"{_DETAILS}, only when the answering deployment has a `price`: what the"
        " row cost in USD.",
    )


_ATTEMPTS_DOC = (
    f"{_DETAILS}: calls made for the row, retries and fallbacks included (0 for a row never"
    " run, e.g. `budget_exceeded`)."
)


class _ContentRow(_RowDetails):
    custom_id: str
    content: str
    tool_calls: list[_ToolCall] = Field(
        ABSENT,
        min_length=1,
        description="Present when the model called tools: the chat-completions `tool_calls` of"
        " the answer (`arguments` is the JSON text the model wrote).",
    )
    attempts: Count = Field(ABSENT, description=_ATTEMPTS_DOC)


class _ResponseRow(_RowDetails):
    custom_id: str
    response: dict[str, Any] = Field(
        description="A batch of another endpoint than chat: the provider's JSON body as it"
        " came (a `CreateEmbeddingResponse`, `Completion`, `ModerationCreateResponse` or"
        " `Response`)."
    )
    attempts: Count = Field(ABSENT, description=_ATTEMPTS_DOC)


class _ErrorRow(_RowDetails):
    custom_id: str
    error: str
    attempts: Count = Field(ABSENT, description=_ATTEMPTS_DOC)


def _outcome(row: Any) -> str:
    if isinstance(row, dict) and "response" in row:
        return "response"
    return "error" if isinstance(row, dict) and "error" in row else "content"


class ResultRow(RootModel[Any]):
    """One row's outcome: its content, or its error."""

    root: Annotated[
        Annotated[_ContentRow, Tag("content")]
        | Annotated[_ResponseRow, Tag("response")]
        | Annotated[_ErrorRow, Tag("error")],
        Discriminator(_outcome),
    ]


class Results(Closed):
    """`GET /v1/batches/{id}/results`."""

    id: Id
    status: Status
    data: list[ResultRow]
    partial: Literal[True] = Field(
        ABSENT, description="Present (true) when the request asked for `partial=true`."
    )


class DeadLetterRow(_RowDetails):
    """A failed row on the dead-letter list."""

    custom_id: str
    error: str
    attempts: Count


class DeadLetters(Closed):
    """`GET /v1/batches/{id}/dead_letter`."""

    id: Id
    data: list[DeadLetterRow]


class _Model(Closed):
    id: str
    object: Literal["model"]


class ModelList(Closed):
    """`GET /v1/models`: the aliases batches can name."""

    object: Literal["list"]
    data: list[_Model]


class _Interval(Closed):
    start: Timestamp
    completed: Count
    failed: Count


class _Bucket(Closed):
    le_ms: int | None
    count: Count
    failed: Count = Field(description="Of `count`, the rows whose outcome is an error.")


class _Latency(Closed):
    """Over the rows with a `latency_ms`; percentiles are null while `count` is 0."""

    count: Count
    p50_ms: int | None = Field(ge=0)
    p90_ms: int | None = Field(ge=0)
    p99_ms: int | None = Field(ge=0)
    max_ms: int | None = Field(ge=0)
    buckets: list[_Bucket] = Field(
        min_length=len(LATENCY_BOUNDS_MS) + 1,
        max_length=len(LATENCY_BOUNDS_MS) + 1,
        description="Rows per latency bucket: each counts the latencies above the previous"
        " bound up to `le_ms`; the last (`le_ms` null) those above"
        f" {LATENCY_BOUNDS_MS[-1]} ms.",
    )


class BatchStats(Closed):
    """`GET /v1/batches/{id}/stats`."""

    id: Id
    object: Literal["batch.stats"]
    status: Status
    started_at: Timestamp | None
    interval_s: int = Field(
        ge=1,
        description="The width of each `progress` interval: the smallest of 1, 2, 5, 10, 15,"
        " 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600 and 86400 s that keeps the"
        f" series to {MAX_INTERVALS} intervals (whole days past that), intervals aligned on"
        " the Unix epoch.",
    )
    progress: list[_Interval] = Field(
        max_length=MAX_INTERVALS,
        description="Rows recorded per interval, from the interval of the first outcome to"
        " that of the last, empty intervals included as zeros.",
    )
    latency: _Latency = Field(
        description="Over the rows with a `latency_ms`; percentiles are null while `count` is 0."
    )


class WebhookAttempt(Closed):
    """One POST of the completion webhook."""

    id: str = Field(
        pattern=r"^[0-9a-f]{32}\.[0-9]+$", description="`<batch id>.<attempt>`; the `after` cursor."
    )
    object: Literal["webhook_delivery"]
    attempt: int = Field(ge=1, description="1 for the first POST.")
    status: Annotated[
        str,
        enum("posting", "delivered", "refused", "failed", "unknown"),
        Field(
            description="`posting` while the POST is out; `refused` by the URL guard (never"
            " sent); `failed`: a non-2xx answer, a timeout or a connection error; `unknown`:"
            " the notifier went silent after starting the POST."
        ),
    ]
    response_status: int | None = Field(
        description="The receiver's HTTP status, or null without one."
    )
    error: str | None = Field(
        description="Why there is no 2xx status (timeout, connection error, refusal), up to"
        " 500 characters."
    )
    attempted_at: Timestamp
    duration_ms: int | None = Field(
        ge=0, description="How long the POST took; null until it ended (or if unknown)."
    )
    redelivery: bool = Field(
        description="Asked for with `POST /v1/batches/{id}/webhook_deliveries`."
    )


class WebhookDeliveries(Closed):
    """`GET /v1/batches/{id}/webhook_deliveries`."""

    object: Literal["list"]
    batch_id: Id
    endpoint_id: str = Field(
        default=ABSENT,
        pattern=r"^we_[0-9a-f]{32}$",
        description="The webhook endpoint asked for (`?endpoint_id=`); absent: the batch's"
        " own completion webhook.",
    )
    status: Annotated[
        str | None,
        enum(*DeliveryStatus, None),
        Field(
            description="The delivery's status (see README, Statuses); null when there is none yet."
        ),
    ]
    next_attempt_at: Timestamp | None = Field(
        description="When a `retrying` delivery's next attempt is due."
    )
    data: list[WebhookAttempt]
    has_more: bool


class WebhookRedelivery(Closed):
    """`POST /v1/batches/{id}/webhook_deliveries`."""

    object: Literal["webhook_delivery.scheduled"]
    batch_id: Id
    endpoint_id: str = Field(
        default=ABSENT,
        pattern=r"^we_[0-9a-f]{32}$",
        description="The webhook endpoint asked for (`?endpoint_id=`); absent: the batch's"
        " own completion webhook.",
    )
    status: Annotated[
        str,
        enum(DeliveryStatus.RETRYING, DeliveryStatus.SENDING),
        Field(
            description="The delivery's stored status: `retrying` (a redelivery or a retry due"
            " now), or `sending` (its first delivery, waiting unclaimed)."
        ),
    ]
    next_attempt_at: Timestamp


TIMELINE_EVENTS = (
    "created", "started", "paused", "resumed", "budget_reached", "finished", "webhook_attempt",
)  # fmt: skip


class TimelineEvent(Closed):
    """One dated event of a job."""

    at: Timestamp
    event: Annotated[str, enum(*TIMELINE_EVENTS)]
    status: str = Field(
        ABSENT,
        description="`finished`: the status the job ended as; `webhook_attempt`: how the"
        " attempt went (the delivery log's attempt status).",
    )
    attempt: int | None = Field(ABSENT, description="`webhook_attempt`: its number.")
    http_status: int | None = Field(
        ABSENT, description="`webhook_attempt`: the receiver's HTTP status (null: no answer)."
    )
    error: str | None = Field(ABSENT, description="`webhook_attempt`: what went wrong.")


class BatchTimeline(Closed):
    """`GET /v1/batches/{id}/timeline`."""

    object: Literal["list"]
    batch_id: Id
    data: list[TimelineEvent]
    has_more: bool


class UsageLine(Closed):
    """One UTC day and model: the sums of the workspace's jobs created that day."""

    day: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    model: str
    jobs: Count
    rows: Count = Field(description="Rows finished (succeeded or failed).")
    failed: Count
    prompt_tokens: Count
    completion_tokens: Count
    cost_usd: float = Field(ge=0)


class Usage(Closed):
    """`GET /v1/usage`."""

    object: Literal["usage"]
    from_: str = Field(alias="from", pattern=r"^\d{4}-\d{2}-\d{2}$")
    to: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    data: list[UsageLine]


class _HeldJob(Closed):
    id: Id
    name: str
    rows: Count


class _Worker(Closed):
    worker: str
    concurrency: Count = Field(description="Rows it runs at once (0: not reported).")
    rows_held: Count = Field(description="Rows it holds: taken from the broker, no outcome yet.")
    jobs: list[_HeldJob] = Field(description="Of those, this workspace's, per job.")
    other_rows: Count = Field(description="Of those, other workspaces' rows.")
    seconds_ago: float = Field(ge=0, description="Since its last heartbeat.")


class _Queue(Closed):
    queue: str
    ready: Count
    consumers: Count


class _Throttle(Closed):
    deployment: str
    retry_after_s: float | None
    seconds_ago: float = Field(ge=0)


class Workers(Closed):
    """`GET /v1/workers`."""

    object: Literal["workers"]
    workers: list[_Worker]
    queues: list[_Queue]
    throttled: list[_Throttle] = Field(description="Deployments that answered 429 lately.")


class _Alive(Closed):
    status: Literal["ok"]


class _Ready(Closed):
    status: Literal["ready"]


class _NotReady(Closed):
    status: Literal["not_ready"]


class _Document(BaseModel):
    """Any OpenAPI document: these keys at least."""

    openapi: str
    info: dict[str, Any]
    paths: dict[str, Any]


# The service endpoints' answers (documented inline: they are no surface's objects).
SERVICE: dict[str, type[BaseModel]] = {
    "healthz": _Alive,
    "ready": _Ready,
    "not_ready": _NotReady,
    "document": _Document,
}
