"""The ``/v1/batches`` handlers: each reads the request, calls the ledger, answers."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from aiohttp import web
from relay_batches.services.ingest_api.idempotency import idempotent
from relay_batches.services.ingest_api.middleware import WORKSPACE_ID, json_response
from relay_batches.services.ingest_api.results import (
    dead_letter_object,
    stream_list,
    stream_results,
)
from relay_batches.services.ingest_api.validation import (
    KnownModels,
    SubmitLimits,
    decode_json_object,
    validate_submit,
)

from relay_batches.cron import next_tick
from relay_batches.errors import ApiError, ConflictError, invalid
from relay_batches.ids import is_valid_id, new_id
from relay_batches.ledger.idempotency import IdempotencyClaim, IdempotencyStore
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.metrics import JOB_TRANSITIONS
from relay_batches.model import TERMINAL, Job, Status

log = logging.getLogger("relay.ingest_api")

DEFAULT_PAGE = 20
MAX_PAGE = 100


@dataclass(frozen=True)
class Announcer:
    """The bus side-effects of the API (each awaits a confirm)."""

    wake_dispatcher: Callable[[Job], Awaitable[None]]
    job_canceled: Callable[[Job], Awaitable[None]]
    template_created: Callable[[Job], Awaitable[None]]


@dataclass(frozen=True)
class ApiDeps:
    """Everything the handlers use, built once in ``__main__``."""

    jobs: JobStore
    idempotency: IdempotencyStore
    announcer: Announcer
    model_known: Callable[[str], bool]
    limits: SubmitLimits
    max_body_bytes: int
    model_names: Callable[[], list[str]] = list  # the router's public aliases


DEPS = web.AppKey("deps", ApiDeps)


def add_batch_routes(app: web.Application) -> None:
    """Register every ``/v1/batches`` route on ``app``."""
    app.router.add_post("/v1/batches", create_batch)
    app.router.add_get("/v1/batches", list_batches)
    app.router.add_get("/v1/batches/{id}", get_batch)
    app.router.add_get("/v1/batches/{id}/results", get_results)
    app.router.add_get("/v1/batches/{id}/dead_letter", get_dead_letters)
    app.router.add_post("/v1/batches/{id}/cancel", cancel_batch)


async def read_json_body(request: web.Request, max_bytes: int) -> bytes:
    """The raw body of a JSON request: 415 for another type, 413 when too large."""
    if request.content_type != "application/json":
        raise ApiError(415, "Content-Type must be application/json")
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        raise ApiError(413, f"request body exceeds {max_bytes} bytes")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, f"request body exceeds {max_bytes} bytes") from None
    if len(raw) > max_bytes:  # a chunked body has no Content-Length to check up front
        raise ApiError(413, f"request body exceeds {max_bytes} bytes")
    return raw


async def create_batch(request: web.Request) -> web.Response:
    """``POST /v1/batches``: validate, store rows with COPY, wake a dispatcher."""
    deps = request.app[DEPS]
    raw = await read_json_body(request, deps.max_body_bytes)
    workspace_id = request[WORKSPACE_ID]

    async def respond(claim: IdempotencyClaim | None) -> web.Response:
        spec = validate_submit(decode_json_object(raw), deps.limits, KnownModels(deps.model_known))
        now = datetime.now(UTC)
        new = NewJob(
            id=new_id(),
            workspace_id=workspace_id,
            name=spec.name or f"batch {now.strftime('%Y-%m-%dT%H:%M:%SZ')}",
            model=spec.model,
            priority=spec.priority,
            total=len(spec.rows),
            webhook_url=spec.webhook_url,
            cron=spec.cron,
            next_run_at=next_tick(spec.cron, now) if spec.cron else None,
            params=spec.params_json,
        )
        rows = ((r.custom_id, r.messages_json) for r in spec.rows)
        batch = await deps.jobs.create(new, rows, claim)
        JOB_TRANSITIONS.labels(batch.status).inc()
        log.info("batch_created", extra={"batch_id": batch.id, "total": batch.total})
        await wake(deps, batch)
        return json_response(batch.to_api(), status=201)

    return await idempotent(request, deps.idempotency, workspace_id, raw, respond)


async def wake(deps: ApiDeps, batch: Job) -> None:
    """Wake a dispatcher for a new queued batch, or schedulers for a new cron template.

    The batch is committed: a lost wake-up only delays it (dispatchers reconcile from the
    ledger, schedulers look again within their sleep cap).
    """
    try:
        if batch.status == Status.QUEUED:
            await deps.announcer.wake_dispatcher(batch)
        elif batch.status == Status.SCHEDULED:
            await deps.announcer.template_created(batch)
    except Exception as exc:
        log.warning("wakeup_failed", extra={"batch_id": batch.id, "error": repr(exc)})


async def _find(request: web.Request) -> Job:
    batch_id = request.match_info["id"]
    batch = None
    if is_valid_id(batch_id):
        batch = await request.app[DEPS].jobs.get(request[WORKSPACE_ID], batch_id)
    if batch is None:
        raise ApiError(404, f"no batch {batch_id!r}", "id")
    return batch


async def get_batch(request: web.Request) -> web.Response:
    """``GET /v1/batches/{id}``."""
    return json_response((await _find(request)).to_api())


async def list_batches(request: web.Request) -> web.Response:
    """``GET /v1/batches``: newest first, ``limit``/``after``/``status``."""
    query = request.query
    limit = _page_limit(query.get("limit"))
    after = query.get("after")
    if after is not None and not is_valid_id(after):
        raise invalid("after must be a batch id", "after")
    status = query.get("status")
    if status is not None and status not in set(Status):
        raise invalid(f"status must be one of {', '.join(s.value for s in Status)}", "status")
    template_id = query.get("template_id")
    if template_id is not None and not is_valid_id(template_id):
        raise invalid("template_id must be a batch id", "template_id")
    page, more = await request.app[DEPS].jobs.list_page(
        request[WORKSPACE_ID], limit, after, status, template_id
    )
    return json_response({"object": "list", "data": [b.to_api() for b in page], "has_more": more})


def _page_limit(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_PAGE
    digits = raw.lstrip("0")  # int() refuses over 4,300 digits: never hand it that many
    short = raw.isascii() and raw.isdigit() and len(digits) <= len(str(MAX_PAGE))
    if not short or not 1 <= int(digits or "0") <= MAX_PAGE:
        raise invalid(f"limit must be an integer from 1 to {MAX_PAGE}", "limit")
    return int(digits)


async def get_results(request: web.Request) -> web.StreamResponse:
    """``GET /v1/batches/{id}/results``: streamed JSON, or ndjson on request."""
    batch = await _find(request)
    return await stream_results(request, batch, request.app[DEPS].jobs.result_pages(batch))


async def get_dead_letters(request: web.Request) -> web.StreamResponse:
    """``GET /v1/batches/{id}/dead_letter``: streamed, in row order (ndjson on request)."""
    batch = await _find(request)
    pages = request.app[DEPS].jobs.dead_letter_pages(batch)
    return await stream_list(request, {"id": batch.id}, pages, dead_letter_object)


async def cancel_batch(request: web.Request) -> web.Response:
    """``POST /v1/batches/{id}/cancel``: 200 with the batch, 409 if already terminal."""
    deps = request.app[DEPS]
    found = await _find(request)
    if found.status in TERMINAL:
        raise ApiError(409, f"batch is already {found.status}", "id")
    try:
        batch = await deps.jobs.cancel(request[WORKSPACE_ID], found.id)
    except ConflictError:
        current = await _find(request)
        raise ApiError(409, f"batch is already {current.status}", "id") from None
    log.info("batch_canceled", extra={"batch_id": batch.id})
    JOB_TRANSITIONS.labels(batch.status).inc()
    try:
        await deps.announcer.job_canceled(batch)
    except Exception as exc:
        # Committed; the aggregator's outbox scan announces the finish later.
        log.warning("cancel_announce_failed", extra={"batch_id": batch.id, "error": repr(exc)})
    return json_response(batch.to_api())
