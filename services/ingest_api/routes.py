"""The ``/v1/batches`` handlers: each reads the request, calls the ledger, answers."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

import orjson
from aiohttp import web

from relay_batches.errors import ApiError, ConflictError, invalid
from relay_batches.ids import is_valid_id
from relay_batches.ledger.idempotency import KeyTaken
from relay_batches.ledger.job_stats import JobStatsStore
from relay_batches.metrics import JOB_TRANSITIONS
from relay_batches.model import TERMINAL, Job, JobStatus
from relay_batches.services.ingest_api.body import read_body
from relay_batches.services.ingest_api.deps import DEPS
from relay_batches.services.ingest_api.idempotency import (
    claim_for,
    raced_response,
    stored_response,
)
from relay_batches.services.ingest_api.middleware import WORKSPACE_ID, json_response
from relay_batches.services.ingest_api.paging import page_limit
from relay_batches.services.ingest_api.results import (
    dead_letter_object,
    partial_flag,
    stream_list,
    stream_results,
    wants_details,
)
from relay_batches.services.ingest_api.submit import plan_submission, submit_one

log = logging.getLogger("relay.ingest_api")

DEFAULT_PAGE = 20
MAX_PAGE = 100
JSON = "application/json"


def add_batch_routes(app: web.Application) -> None:
    """Register every ``/v1/batches`` route on ``app``."""
    app.router.add_post("/v1/batches", create_batch)
    app.router.add_get("/v1/batches", list_batches)
    app.router.add_get("/v1/batches/{id}", get_batch)
    app.router.add_get("/v1/batches/{id}/results", get_results)
    app.router.add_get("/v1/batches/{id}/dead_letter", get_dead_letters)
    app.router.add_get("/v1/batches/{id}/stats", get_stats)
    app.router.add_post("/v1/batches/{id}/cancel", cancel_batch)


async def create_batch(request: web.Request) -> web.Response:
    """``POST /v1/batches``: validate, store rows with COPY, wake a dispatcher."""
    deps = request.app[DEPS]
    workspace_id = request[WORKSPACE_ID]
    async with deps.body_gate.admit(workspace_id) as ticket:  # a large body holds its slot
        raw = await read_body(request, JSON, deps.max_body_bytes, ticket)
        claim = claim_for(request, workspace_id, raw)
        if (replayed := await stored_response(deps.idempotency, claim)) is not None:
            return replayed
        now = datetime.now(UTC)
        loop = asyncio.get_running_loop()
        planned = await loop.run_in_executor(
            deps.parser_for(ticket.large), plan_submission, raw, deps, workspace_id, now
        )
        del raw  # the validated rows are all that is kept while they are stored
        try:
            job = await submit_one(deps, planned, claim)
        except KeyTaken:
            return await raced_response(deps.idempotency, claim)
    return json_response(batch_object(job), status=201)


def batch_object(job: Job) -> dict[str, object]:
    """``batch.to_api()`` with ``params`` embedded as the stored JSON text, so a batch
    always encodes (orjson refuses to re-encode past 255 levels of nesting)."""
    data = job.to_api()
    data["params"] = orjson.Fragment(job.params)
    return data


async def _find(request: web.Request) -> Job:
    batch_id = request.match_info["id"]
    job = None
    if is_valid_id(batch_id):
        job = await request.app[DEPS].jobs.get(request[WORKSPACE_ID], batch_id)
    if job is None:
        raise ApiError(404, f"no batch {batch_id!r}", "id")
    return job


async def get_batch(request: web.Request) -> web.Response:
    """``GET /v1/batches/{id}``."""
    return json_response(batch_object(await _find(request)))


async def list_batches(request: web.Request) -> web.Response:
    """``GET /v1/batches``: newest first, ``limit``/``after``/``status``."""
    query = request.query
    limit = page_limit(query.get("limit"), DEFAULT_PAGE, MAX_PAGE)
    after = query.get("after")
    if after is not None and not is_valid_id(after):
        raise invalid("after must be a batch id", "after")
    status = _status_filter(query.get("status"))
    template_id = query.get("template_id")
    if template_id is not None and not is_valid_id(template_id):
        raise invalid("template_id must be a batch id", "template_id")
    page, more = await request.app[DEPS].jobs.list_page(
        request[WORKSPACE_ID], limit, after, status, template_id
    )
    return json_response(
        {"object": "list", "data": [batch_object(b) for b in page], "has_more": more}
    )


def _status_filter(value: str | None) -> JobStatus | None:
    """The ``status`` query parameter as a job status, or a 400 naming it."""
    if value is None:
        return None
    try:
        return JobStatus(value)
    except ValueError:
        raise invalid(
            f"status must be one of {', '.join(s.value for s in JobStatus)}", "status"
        ) from None


async def get_results(request: web.Request) -> web.StreamResponse:
    """``GET /v1/batches/{id}/results``: streamed JSON, or ndjson on request;
    ``partial=true`` shows the rows finished so far, ``include=details`` their details."""
    partial = partial_flag(request.query.get("partial"))
    details = wants_details(request.query.get("include"))
    job = await _find(request)
    jobs = request.app[DEPS].jobs
    pages = jobs.detailed_result_pages(job) if details else jobs.result_pages(job)
    return await stream_results(request, job, pages, partial)


async def get_dead_letters(request: web.Request) -> web.StreamResponse:
    """``GET /v1/batches/{id}/dead_letter``: streamed, in row order (ndjson on request);
    ``include=details`` adds every row's details."""
    details = wants_details(request.query.get("include"))
    job = await _find(request)
    jobs = request.app[DEPS].jobs
    pages = jobs.detailed_dead_letter_pages(job) if details else jobs.dead_letter_pages(job)
    return await stream_list(request, {"id": job.id}, pages, dead_letter_object)


async def get_stats(request: web.Request) -> web.Response:
    """``GET /v1/batches/{id}/stats``: rows finished per interval and the latency
    histogram, summed up in the ledger (bounded whatever the job's size)."""
    job = await _find(request)
    stats = await JobStatsStore(request.app[DEPS].pool).stats(job)
    return json_response(stats.to_api())


async def cancel_batch(request: web.Request) -> web.Response:
    """``POST /v1/batches/{id}/cancel``: 200 with the batch, 409 if already terminal."""
    deps = request.app[DEPS]
    found = await _find(request)
    if found.status in TERMINAL:
        raise ApiError(409, f"batch is already {found.status}", "id")
    try:
        job = await deps.jobs.cancel(request[WORKSPACE_ID], found.id)
    except ConflictError:
        current = await _find(request)
        raise ApiError(409, f"batch is already {current.status}", "id") from None
    log.info("batch_canceled", extra={"batch_id": job.id})
    JOB_TRANSITIONS.labels(job.status).inc()
    try:
        await deps.announcer.job_canceled(job)
    except Exception as exc:
        # Committed; the aggregator's outbox scan announces the finish later.
        log.warning("cancel_announce_failed", extra={"batch_id": job.id, "error": repr(exc)})
    return json_response(batch_object(job))
