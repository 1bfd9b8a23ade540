"""The native surface's OpenAPI document apart from its paths: the head (info, tags, the
security scheme), the shared parameters and error responses, and the helpers its paths
(:mod:`.openapi`) are written with."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from relay_batches.services.ingest_api.surfaces.native import shapes
from relay_batches.services.ingest_api.surfaces.native.results import OUTCOME_VALUES

OPENAPI_VERSION = "3.1.0"
INFO = {
    "title": "Relay Batches",
    "version": "0.1.0",
    "summary": "Asynchronous batch runs of LLM chat requests.",
    "description": "The public API of relay-ingest-api. Every `/v1/…` request carries"
    " `Authorization: Bearer <api key>`; a key of another workspace gets 404 for your"
    " batches, exactly as for an id that does not exist. Every 4xx/5xx body is"
    ' `{"error": {"type", "message", "param"}}`. Timestamps are ISO 8601 UTC to the second'
    " with a `Z`; ids are 32-character lowercase hex strings. Responses may gain new fields"
    " in later versions: clients should ignore fields they do not know.",
}
TAGS = [
    {"name": "batches", "description": "Submit, list, inspect and cancel batches."},
    {"name": "models", "description": "The model aliases batches can name."},
    {"name": "usage", "description": "Rows, tokens and cost of the jobs; the live fleet."},
    {
        "name": "webhooks",
        "description": "The workspace's webhook endpoints: an OpenAI event when a batch ends.",
    },
    {
        "name": "service",
        "description": "Health, readiness and this document (no authentication; metrics are"
        " on the health port).",
    },
]
SECURITY_SCHEMES = {
    "bearerAuth": {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key from `relay keys create --workspace W`.",
    }
}
_BEARER: list[dict[str, list[str]]] = [{"bearerAuth": []}]
REF = "#/components/{section}/{name}"
# The errors of an operation that reads a request body.
BODY_ERRORS = (400, 408, 409, 413, 415)


def ref(section: str, name: str) -> dict[str, str]:
    return {"$ref": REF.format(section=section, name=name)}


def schema(model: type) -> dict[str, str]:
    return ref("schemas", model.__name__)


def head() -> dict[str, Any]:
    """The document before any surface's paths: its version, info, tags, security scheme."""
    return {
        "openapi": OPENAPI_VERSION,
        "info": dict(INFO),
        "tags": [dict(tag) for tag in TAGS],
        "paths": {},
        "components": {"securitySchemes": SECURITY_SCHEMES, "schemas": {}},
    }


# --- shared parameters and responses --------------------------------------------------

_ENUM_PARAM = {"type": "string", "enum": ["true", "false"]}
PARAMETERS: dict[str, dict[str, Any]] = {
    "BatchId": {
        "name": "id",
        "in": "path",
        "required": True,
        "description": "The batch id. Anything that is not a batch id of the caller's"
        " workspace is 404.",
        "schema": {"type": "string"},
    },
    "IdempotencyKey": {
        "name": "Idempotency-Key",
        "in": "header",
        "required": False,
        "description": "Retry safety: the same key within 24 hours returns the first response"
        " again and creates nothing new; the same key with a different body is 409.",
        "schema": {"type": "string"},
    },
    "Partial": {
        "name": "partial",
        "in": "query",
        "description": "`true`: every row that has an outcome so far, in row order, whatever"
        " the status (the document's head says `partial: true`); `false` or absent: the rows"
        ' only once the job is terminal. Any other value is a 400 (`param: "partial"`).',
        "schema": _ENUM_PARAM,
    },
    "Include": {
        "name": "include",
        "in": "query",
        "description": "`details`: every row also carries `usage`, `attempts`, `deployment`,"
        " `latency_ms`, `finish_reason` and (when priced) `cost_usd`. Any other value is a 400"
        ' (`param: "include"`).',
        "schema": {"type": "string", "enum": ["details"]},
    },
    "Outcome": {
        "name": "outcome",
        "in": "query",
        "description": "`error`: only the failed rows (dead letters included); `content`: only"
        " the rows that succeeded; absent: every row. Any other value is a 400"
        ' (`param: "outcome"`).',
        "schema": {"type": "string", "enum": list(OUTCOME_VALUES)},
    },
}

# name: (status whose error object it carries, description)
RESPONSES = {
    "BadRequest": (
        400,
        "The request is invalid; `param` names the offending field where there is one.",
    ),
    "Unauthorized": (401, "Missing, malformed or unknown API key."),
    "NotFound": (
        404,
        "No such batch in the caller's workspace (a batch of another workspace gets exactly"
        " this answer).",
    ),
    "Conflict": (
        409,
        "Cancel: the batch is already terminal. Create and upload: the Idempotency-Key was"
        " used within 24 hours with a different body.",
    ),
    "RedeliveryConflict": (
        409,
        "Redelivery: the batch is not terminal, is a cron template, an attempt is under way"
        " (claimed `sending`, or `posting`), the delivery's last attempt ended less than 10 s"
        " ago, or the delivery has made 100 attempts (the most); the message names the"
        " reason.",
    ),
    "NoWebhookUrl": (
        400,
        'Redelivery: the batch has no webhook URL (`param: "webhook_url"`).',
    ),
    "TooLarge": (
        413,
        "The body exceeds the configured limit (`RELAY_MAX_JSON_BODY_BYTES`, default 100 MiB,"
        " for a JSON body; `RELAY_MAX_BODY_BYTES`, default 256 MiB, for an upload), counted"
        " after inflating a `gzip` or `deflate` body.",
    ),
    "UnsupportedMediaType": (
        415,
        "The Content-Type is not the one this endpoint takes, a JSON body declares a"
        ' `charset` other than UTF-8 (`param: "Content-Type"`, the message names it), or the'
        ' Content-Encoding is not `gzip`, `deflate` or `identity` (`param: "Content-Encoding"`).',
    ),
    "Unavailable": (
        503,
        "Postgres is briefly unreachable, or its schema is not yet at this release's version"
        " (a migration is pending), or (on the creating endpoints) a large body arrived while"
        " every large-body slot (`RELAY_MAX_LARGE_BODIES`) is busy or its workspace already"
        " holds one; retry after `Retry-After` seconds.",
    ),
    "RequestTimeout": (
        408,
        "The client sent no byte of its body for `RELAY_BODY_READ_TIMEOUT_S` (default 30 s),"
        " or after that long averaged under `RELAY_BODY_MIN_RATE` (default 64 KiB/s); the"
        " connection is closed after this answer.",
    ),
    "NotEnded": (
        409,
        "Delete: the batch is queued, running or paused (`param` is `id`); cancel it, or wait"
        " for it to end, first.",
    ),
}
# The response each error status of an operation refers to, unless it names another.
_BY_STATUS = {400: "BadRequest", 401: "Unauthorized", 404: "NotFound", 408: "RequestTimeout"}
_BY_STATUS |= {409: "Conflict", 413: "TooLarge", 415: "UnsupportedMediaType", 503: "Unavailable"}
_RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before retrying.",
        "schema": {"type": "integer", "minimum": 1},
    }
}


def error_response(status: int, description: str) -> dict[str, Any]:
    response: dict[str, Any] = {"description": description}
    if status == 503:
        response["headers"] = _RETRY_AFTER
    response["content"] = {"application/json": {"schema": schema(shapes.ERRORS[status])}}
    return response


def json(model: type, description: str, **extra: Any) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": schema(model)}},
        **extra,
    }


def links(pointer: str, *operations: str) -> dict[str, Any]:
    """OpenAPI links from a response to operations taking the batch id at ``pointer``:
    each ``name=operationId``."""
    found: dict[str, Any] = {}
    for pair in operations:
        name, _, operation_id = pair.partition("=")
        found[name] = {
            "operationId": operation_id,
            "parameters": {"id": f"$response.body#{pointer}"},
        }
    return found


def operation(
    operation_id: str,
    summary: str,
    ok: dict[str, dict[str, Any]],
    errors: tuple[int | str, ...] = (),
    *,
    tag: str = "batches",
    description: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """An operation behind the bearer key: 401 and 503 besides ``errors`` (a status, or the
    name of a shared response for one that is not its status's usual)."""
    responses: dict[str, Any] = dict(ok)
    for error in (401, 503, *errors):
        name = error if isinstance(error, str) else _BY_STATUS[error]
        responses[str(RESPONSES[name][0])] = ref("responses", name)
    found: dict[str, Any] = {"operationId": operation_id, "summary": summary}
    if description is not None:
        found["description"] = description
    found |= {"tags": [tag], "security": _BEARER, **extra}
    found["responses"] = dict(sorted(responses.items()))
    return found


def query(name: str, description: str | None, schema: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {"name": name, "in": "query"}
    if description is not None:
        found["description"] = description
    return {**found, "schema": schema}


def ndjson(model: type) -> dict[str, Any]:
    return {
        "schema": {
            "type": "string",
            "description": "Sent when the request's `Accept` includes `application/x-ndjson`:"
            f" one `{model.__name__}` object (#/components/schemas/{model.__name__}) per line,"
            " each line ending in a newline; no envelope.",
        }
    }


def service(operation_id: str, summary: str, responses: dict[str, Any]) -> dict[str, Any]:
    """A service endpoint: no authentication."""
    return {
        "operationId": operation_id,
        "summary": summary,
        "tags": ["service"],
        "security": [],
        "responses": responses,
    }


def inline(model: type[BaseModel], description: str) -> dict[str, Any]:
    from relay_batches.services.ingest_api.openapi import inline_schema

    return {
        "description": description,
        "content": {"application/json": {"schema": inline_schema(model)}},
    }
