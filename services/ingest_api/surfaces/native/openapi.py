"""The native surface in the OpenAPI document: its paths declared here, its schemas
generated from the models of :mod:`.shapes` and :mod:`.outcomes`, the head and shared
components from :mod:`.document` (one entry of ``openapi.FRAGMENTS``).

The service endpoints (``/healthz``, ``/readyz``, ``/openapi.json``) are documented here
too: they belong to no provider's surface.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from relay_batches.dialects.chat import Message, Params, RequestRow
from relay_batches.services.ingest_api import webhook_endpoint_shapes as endpoints
from relay_batches.services.ingest_api.surfaces.native import (
    openapi_estimate,
    outcomes,
    shapes,
)
from relay_batches.services.ingest_api.surfaces.native.batches import (
    DEFAULT_PAGE,
    MAX_PAGE,
    MAX_SEARCH_CHARS,
    RETRY_BODY_BYTES,
)
from relay_batches.services.ingest_api.surfaces.native.document import (
    BODY_ERRORS,
    PARAMETERS,
    RESPONSES,
    error_response,
    inline,
    json,
    links,
    ndjson,
    operation,
    query,
    ref,
    schema,
    service,
)
from relay_batches.services.ingest_api.surfaces.native.openapi_activity import (
    timeline_path,
    usage_path,
    workers_path,
)
from relay_batches.services.ingest_api.surfaces.native.openapi_webhooks import (
    webhook_deliveries_path,
    webhook_endpoints_paths,
)

# Every schema the native surface names (the models they use come along).
REQUESTS: tuple[type[BaseModel], ...] = (
    shapes.CreateBatch,
    *openapi_estimate.REQUESTS,
    shapes.UploadForm,
    shapes.RetryBatch,
    endpoints.CreateWebhookEndpoint,
)
RESPONSES_MODELS: tuple[type[BaseModel], ...] = (
    shapes.Batch,
    *openapi_estimate.RESPONSES,
    shapes.BatchList,
    shapes.BatchCreatedList,
    shapes.BatchDeleted,
    outcomes.Results,
    outcomes.ResultRow,
    outcomes.DeadLetters,
    outcomes.DeadLetterRow,
    outcomes.ModelList,
    outcomes.BatchStats,
    outcomes.WebhookDeliveries,
    outcomes.WebhookAttempt,
    outcomes.WebhookRedelivery,
    outcomes.BatchTimeline,
    outcomes.Usage,
    outcomes.Workers,
    *endpoints.MODELS,
    *shapes.ERRORS.values(),
)

_CREATED_LINKS: tuple[str, ...] = ("GetBatch=getBatch", "GetResults=getResults")
_CREATED_LINKS += ("GetDeadLetters=getDeadLetters", "CancelBatch=cancelBatch")
_LIST_LINKS: tuple[str, ...] = ("GetFirstBatch=getBatch", "GetFirstResults=getResults")
_LIST_LINKS += ("GetFirstDeadLetters=getDeadLetters",)
_IDEMPOTENT: dict[str, Any] = {"parameters": [ref("parameters", "IdempotencyKey")]}
_EXAMPLE = {
    "name": "Review sentiment — October",
    "model": "gpt-4o-mini",
    "requests": [
        {"custom_id": "r-1", "messages": [{"role": "user", "content": "Classify: great product!"}]},
        {
            "custom_id": "r-2",
            "messages": [{"role": "user", "content": "Classify: terrible service"}],
        },
    ],
    "priority": 5,
    "params": {"temperature": 0.2, "max_tokens": 64},
}


def _batches() -> dict[str, Any]:
    """``/v1/batches``: submit and list."""
    next_page = {
        "NextPage": {
            "operationId": "listBatches",
            "parameters": {"after": "$response.body#/data/0/id"},
        }
    }
    return {
        "post": operation(
            "createBatch",
            "Submit a batch",
            {
                "201": json(
                    shapes.Batch,
                    "Created. A cron template answers `status: scheduled` and its `next_run_at`.",
                    links=links("/id", *_CREATED_LINKS),
                )
            },
            BODY_ERRORS,
            **_IDEMPOTENT,
            requestBody={
                "required": True,
                "description": "Limits: body ≤ `RELAY_MAX_JSON_BODY_BYTES` (413, default 100"
                " MiB; a larger job goes as an upload); a body that is not JSON, or not an"
                " object, is 400; another Content-Type, or a `charset` other than UTF-8, is 415.",
                "content": {
                    "application/json": {
                        "schema": schema(shapes.CreateBatch),
                        "examples": {"two-rows": {"value": _EXAMPLE}},
                    }
                },
            },
        ),
        "get": operation(
            "listBatches",
            "List batches, newest first (this workspace only)",
            {
                "200": json(
                    shapes.BatchList,
                    "One page.",
                    links={**links("/data/0/id", *_LIST_LINKS), **next_page},
                )
            },
            (400,),
            parameters=[
                query(
                    "limit",
                    f"Page size, default {DEFAULT_PAGE}.",
                    {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": DEFAULT_PAGE},
                ),
                query("after", "The last id of the previous page.", schema(shapes.Id)),
                query("status", None, schema(shapes.Status)),
                query(
                    "template_id",
                    "Only the runs spawned by this cron template.",
                    schema(shapes.Id),
                ),
                query(
                    "search",
                    "Only the batches whose id is this, or whose name or metadata (keys and"
                    " values) holds it, ignoring case; `key=value`: whose metadata has that pair.",
                    {"type": "string", "maxLength": MAX_SEARCH_CHARS},
                ),
            ],
        ),
    }


def _upload() -> dict[str, Any]:
    """``/v1/batches/upload``: one batch per file."""
    return {
        "post": operation(
            "uploadBatches",
            "Upload .csv / .jsonl files, one batch per file",
            {"201": json(shapes.BatchCreatedList, "Created, one batch per file in upload order.")},
            BODY_ERRORS,
            **_IDEMPOTENT,
            requestBody={
                "required": True,
                "content": {
                    "multipart/form-data": {
                        "schema": schema(shapes.UploadForm),
                        "encoding": {
                            "file": {
                                "contentType": "text/csv, application/x-ndjson,"
                                " application/octet-stream"
                            },
                            "params": {"contentType": "application/json"},
                        },
                    }
                },
            },
        )
    }


def _one_batch() -> dict[str, dict[str, Any]]:
    """``/v1/batches/{id}`` and the paths under it, each taking the batch id."""
    paths: dict[str, dict[str, Any]] = {
        "": {
            "get": operation(
                "getBatch", "Get a batch", {"200": json(shapes.Batch, "The batch.")}, (404,)
            ),
            "delete": operation(
                "deleteBatch",
                "Delete an ended batch or a cron template",
                {"200": json(shapes.BatchDeleted, "The batch is deleted.")},
                (404, "NotEnded"),
                description="Deletes the batch with its rows, results, dead letters, webhook"
                " deliveries and their log, and the Idempotency-Key record of its creation;"
                " afterwards every endpoint answers 404 for it. A batch must have ended"
                " (completed, failed, canceled, expired); a cron template (scheduled) may be"
                " deleted at any time: it spawns no further runs, and the runs it already made"
                " keep working (their `template_id` becomes null; the rows they share go with"
                " the last of them). Deleting a retry removes it from its original's"
                " `retries`; deleting an original clears its retries' `retry_of`.",
            ),
        },
        "/results": {
            "get": _streamed(
                "getResults",
                "Results in submission order (streamed)",
                ("The results.", outcomes.Results, outcomes.ResultRow),
                "`data` is empty until the job is terminal (completed, failed, canceled or"
                " expired); then it holds one row per outcome, in submission order. With"
                " `partial=true` it holds every row finished so far, whatever the status, and"
                " the head says `partial: true`. With `include=details` every row carries its"
                " details; with `outcome=error` only the failed rows are listed (`content`:"
                " only the successes).",
                "Partial",
                "Include",
                "Outcome",
            )
        },
        "/dead_letter": {
            "get": _streamed(
                "getDeadLetters",
                "Failed rows worth replaying (streamed)",
                ("The dead-letter list.", outcomes.DeadLetters, outcomes.DeadLetterRow),
                "Rows whose last failure was transient and outlived every retry and fallback,"
                " in row order.",
                "Include",
            )
        },
        "/stats": {
            "get": operation(
                "getBatchStats",
                "Progress over time and the latency histogram",
                {"200": json(outcomes.BatchStats, "The stats.")},
                (404,),
                description="Summed up in the ledger in one query, bounded whatever the job's"
                " size: rows finished per interval (succeeded and failed) and per-row latency"
                " in fixed buckets with p50/p90/p99.",
            )
        },
        **_transitions(),
        "/retry": {"post": _retry()},
        "/webhook_deliveries": webhook_deliveries_path(),
        "/timeline": timeline_path(),
    }
    return {
        f"/v1/batches/{{id}}{tail}": {"parameters": [ref("parameters", "BatchId")], **item}
        for tail, item in paths.items()
    }


def _streamed(
    operation_id: str,
    summary: str,
    answer: tuple[str, type, type],
    description: str,
    *parameters: str,
) -> dict[str, Any]:
    """A listing of rows answered as one JSON object (``answer``: its description, its
    model, its row's model) or, asked for, as NDJSON lines of rows."""
    said, envelope, row = answer
    ok = {
        "description": said,
        "content": {
            "application/json": {"schema": schema(envelope)},
            "application/x-ndjson": ndjson(row),
        },
    }
    return operation(
        operation_id,
        summary,
        {"200": ok},
        (400, 404),
        description=description,
        parameters=[ref("parameters", name) for name in parameters],
    )


def _transitions() -> dict[str, dict[str, Any]]:
    """``cancel``, ``pause`` and ``resume``: each answers the batch, 409 from a status that
    does not allow it."""
    found = {}
    for verb, summary, ok, description in (
        (
            "cancel",
            "Cancel a queued, running, paused or scheduled batch",
            "The canceled batch.",
            "Counters and results as of the cancel are final. Canceling a cron template stops"
            " future ticks.",
        ),
        (
            "pause",
            "Pause a queued or running batch",
            "The paused batch (`status: paused`).",
            "Within about a second no more rows start: rows not released stay, rows released"
            " and not started go back and run after the resume; the rows already started"
            " still finish and count (so a paused batch may still complete, or fail on its"
            " budget). A paused batch holds"
            " no running slot. It can be resumed, canceled, or expire past its completion"
            " window. 409 from any other status.",
        ),
        (
            "resume",
            "Resume a paused batch",
            "The batch, `status: queued`.",
            "The batch is queued again and a dispatcher claims it in its workspace's turn,"
            " from where it left off (rows with an outcome never run again); its `started_at`"
            " is kept and its `rows_per_s` measured afresh. 409 unless the batch is paused.",
        ),
    ):
        found[f"/{verb}"] = {
            "post": operation(
                f"{verb}Batch",
                summary,
                {"200": json(shapes.Batch, ok)},
                (404, 409),
                description=description,
            )
        }
    return found


def _retry() -> dict[str, Any]:
    """``POST /v1/batches/{id}/retry``."""
    return operation(
        "retryBatch",
        "Retry an ended batch's failed rows as a new batch",
        {
            "201": json(
                shapes.Batch,
                "Created: the new batch (`status: queued`, `retry_of` set).",
                links=links("/id", "GetBatch=getBatch"),
            )
        },
        (404, *BODY_ERRORS),
        description="A new batch of exactly the rows with an error outcome (`failed`) or on"
        " the dead-letter list (`dead_letter`), in their order, with their `custom_id`s and"
        " requests, and the original's `model`, `params`, `priority`, `webhookUrl`,"
        " `metadata`, `name` and completion window (a new deadline from now); its `retry_of`"
        " is the original, whose `retries` gains it. 409 on a batch that has not ended"
        " (queued, running, paused, scheduled); 400 `param: rows` when it has no such row.",
        **_IDEMPOTENT,
        requestBody={
            "required": False,
            "description": "Optional: an empty body retries the `failed` rows. Another key is"
            " 400 naming it; another Content-Type, or a `charset` other than UTF-8, is 415; at most"
            f" {RETRY_BODY_BYTES} bytes (413).",
            "content": {
                "application/json": {
                    "schema": schema(shapes.RetryBatch),
                    "examples": {"dead-letters": {"value": {"rows": "dead_letter"}}},
                }
            },
        },
    )


def _paths() -> dict[str, Any]:
    answers = outcomes.SERVICE
    return {
        "/v1/batches": _batches(),
        "/v1/batches/upload": _upload(),
        "/v1/batches/estimate": openapi_estimate.estimate_path(),
        **_one_batch(),
        "/v1/usage": usage_path(),
        "/v1/workers": workers_path(),
        **webhook_endpoints_paths(),
        "/v1/models": {
            "get": operation(
                "listModels",
                "The public model aliases",
                {"200": json(outcomes.ModelList, "Every alias of the router, sorted by id.")},
                tag="models",
            )
        },
        "/healthz": {
            "get": service(
                "healthz", "The process is alive", {"200": inline(answers["healthz"], "Alive.")}
            )
        },
        "/readyz": {
            "get": service(
                "readyz",
                "Postgres and RabbitMQ connections are up",
                {
                    "200": inline(answers["ready"], "Ready."),
                    "503": inline(answers["not_ready"], "Not ready."),
                },
            )
        },
        "/openapi.json": {
            "get": service(
                "openapi",
                "This document",
                {"200": inline(answers["document"], "The OpenAPI 3.1 document.")},
            )
        },
    }


def native_fragment() -> dict[str, dict[str, Any]]:
    """The surface's paths, shared parameters and responses, and schemas for
    ``openapi.FRAGMENTS`` (the stored chat row's schemas are the chat fragment's)."""
    from relay_batches.services.ingest_api.openapi import FlatNullable, model_schemas

    chat = model_schemas(RequestRow, Message, Params)
    schemas = model_schemas(*REQUESTS, generator=FlatNullable)
    schemas |= model_schemas(*RESPONSES_MODELS, mode="serialization", generator=FlatNullable)
    return {
        "paths": _paths(),
        "schemas": {name: s for name, s in schemas.items() if name not in chat},
        "parameters": PARAMETERS,
        "responses": {
            name: error_response(status, description)
            for name, (status, description) in RESPONSES.items()
        },
    }
