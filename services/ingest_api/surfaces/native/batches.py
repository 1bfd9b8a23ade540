"""The ``/v1/batches`` handlers: each reads the request, calls the ledger, answers."""

from __future__ import annotations

import logging
from collections.abc import Set

import orjson
from aiohttp import web

from relay_batches.errors import ApiError, ConflictError, invalid
from relay_batches.ids import is_valid_id, new_id
from relay_batches.ledger.deletion import Deleted, JobDeletion, StillLive
from relay_batches.ledger.idempotency import KeyTaken
from relay_batches.ledger.job_retry import NothingToRetry, RetryRows
from relay_batches.ledger.job_stats import JobStatsStore
from relay_batches.metrics import JOB_TRANSITIONS
from relay_batches.model import PAUSABLE, TERMINAL, Job, JobStatus
from relay_batches.services.ingest_api.create import Creation, as_read, create, one_job, read_json
from relay_batches.services.ingest_api.deps import DEPS
from relay_batches.services.ingest_api.edge.body import read_body
from relay_batches.services.ingest_api.edge.idempotency import (
    claim_for,
    raced_response,
    stored_response,
)
from relay_batches.services.ingest_api.edge.middleware import WORKSPACE_ID, json_response
from relay_batches.services.ingest_api.edge.paging import page_limit
from relay_batches.services.ingest_api.rows.validation import (
    decode_json_object,
)
from relay_batches.services.ingest_api.submit import plan_submission, store_one, wake
from relay_batches.services.ingest_api.surfaces.native.results import (
    dead_letter_object,
    outcome_filter,
    partial_flag,
    single,
    stream_list,
    stream_results,
    wants_details,
)

log = logging.getLogger("relay.ingest_api")

DEFAULT_PAGE = 20
MAX_PAGE = 100
MAX_SEARCH_CHARS = 256  # a search of the job list: an id, a name or metadata text
JSON = "application/json"
RETRY_BODY_BYTES = 4096  # {"rows": "dead_letter"} and some room


def add_batch_routes(app: web.Application) -> None:
    """Register every ``/v1/batches`` route on ``app``."""
    app.router.add_post("/batches", create_batch)
    app.router.add_get("/batches", list_batches)
    app.router.add_get("/batches/{id}", get_batch)
    app.router.add_delete("/batches/{id}", delete_batch)
    app.router.add_get("/batches/{id}/results", get_results)
    app.router.add_get("/batches/{id}/dead_letter", get_dead_letters)
    app.router.add_get("/batches/{id}/stats", get_stats)
    app.router.add_post("/batches/{id}/cancel", cancel_batch)
    app.router.add_post("/batches/{id}/pause", pause_batch)
    app.router.add_post("/batches/{id}/resume", resume_batch)
    app.router.add_post("/batches/{id}/retry", retry_batch)


async def create_batch(request: web.Request) -> web.Response:
    """``POST /v1/batches``: validate, store rows with COPY, wake a dispatcher."""
    return await create(request, CREATE)


def _created(_: web.Request, job: Job) -> web.Response:
    return json_response(batch_object(job), status=201)


CREATE = Creation(read_json, as_read, plan_submission, store_one, one_job, _created)


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


async def delete_batch(request: web.Request) -> web.Response:
    """``DELETE /v1/batches/{id}``: an ended batch or a cron template, with its rows,
    outcomes, deliveries and idempotency records; 409 while it is queued, running or
    paused. Afterwards every endpoint answers 404 for it."""
    found = await _find(request)
    deletion = JobDeletion(request.app[DEPS].pool)
    try:
        done = await deletion.delete(request[WORKSPACE_ID], found.id, templates=True)
    except StillLive as live:
        raise ApiError(
            409, f"batch is {live.status}: cancel it, or wait for it to end, first", "id"
        ) from None
    if done is Deleted.NOT_FOUND:  # deleted by a concurrent request
        raise ApiError(404, f"no batch {found.id!r}", "id")
    log.info("batch_deleted", extra={"batch_id": found.id})
    return json_response({"id": found.id, "object": "batch.deleted", "deleted": True})


async def list_batches(request: web.Request) -> web.Response:
    """``GET /v1/batches``: newest first, ``limit``/``after``/``status``/``template_id``/
    ``search`` (an id, or text in the name or metadata)."""
    query = request.query
    limit = page_limit(query.get("limit"), DEFAULT_PAGE, MAX_PAGE)
    after = query.get("after")
    if after is not None and not is_valid_id(after):
        raise invalid("after must be a batch id", "after")
    status = _status_filter(query.get("status"))
    template_id = query.get("template_id")
    if template_id is not None and not is_valid_id(template_id):
        raise invalid("template_id must be a batch id", "template_id")
    search = _search(query.get("search"))
    page, more = await request.app[DEPS].jobs.list_page(
        request[WORKSPACE_ID], limit, after, status, template_id, search
    )
    return json_response(
        {"object": "list", "data": [batch_object(b) for b in page], "has_more": more}
    )


def _search(value: str | None) -> str | None:
    """The ``search`` query parameter: trimmed, blank as absent, 400 past
    ``MAX_SEARCH_CHARS`` or holding a control character."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    if len(value) > MAX_SEARCH_CHARS or not value.isprintable():
        raise invalid(f"search must be at most {MAX_SEARCH_CHARS} printable characters", "search")
    return value


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
    ``partial=true`` shows the rows finished so far, ``include=details`` their details,
    ``outcome=error`` (or ``content``) only the failed (or succeeded) rows."""
    partial = partial_flag(single(request, "partial"))
    details = wants_details(single(request, "include"))
    outcome = outcome_filter(single(request, "outcome"))
    job = await _find(request)
    jobs = request.app[DEPS].jobs
    pages = (jobs.detailed_result_pages if details else jobs.result_pages)(job, outcome=outcome)
    return await stream_results(request, job, pages, partial)


async def get_dead_letters(request: web.Request) -> web.StreamResponse:
    """``GET /v1/batches/{id}/dead_letter``: streamed, in row order (ndjson on request);
    ``include=details`` adds every row's details."""
    details = wants_details(single(request, "include"))
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


async def pause_batch(request: web.Request) -> web.Response:
    """``POST /v1/batches/{id}/pause``: 200 with the paused batch (from queued or
    running), 409 otherwise; then the owning dispatcher is told to stop releasing rows."""
    deps = request.app[DEPS]
    found = await _find(request)
    try:
        job = await deps.jobs.pause(request[WORKSPACE_ID], found.id)
    except ConflictError:
        raise await _not_from(request, PAUSABLE, "paused") from None
    log.info("batch_paused", extra={"batch_id": job.id})
    JOB_TRANSITIONS.labels(job.status).inc()
    try:
        await deps.announcer.job_paused(job)
    except Exception as exc:
        # Committed; its dispatcher's next lease renewal finds it paused and lets it go.
        log.warning("pause_announce_failed", extra={"batch_id": job.id, "error": repr(exc)})
    return json_response(batch_object(job))


async def resume_batch(request: web.Request) -> web.Response:
    """``POST /v1/batches/{id}/resume``: 200 with the batch queued again (from paused),
    409 otherwise; then a dispatcher is woken."""
    deps = request.app[DEPS]
    found = await _find(request)
    try:
        job = await deps.jobs.resume(request[WORKSPACE_ID], found.id)
    except ConflictError:
        raise await _not_from(request, {JobStatus.PAUSED}, "resumed") from None
    log.info("batch_resumed", extra={"batch_id": job.id})
    JOB_TRANSITIONS.labels(job.status).inc()
    await wake(deps, job)
    return json_response(batch_object(job))


async def _not_from(request: web.Request, allowed: Set[JobStatus], verb: str) -> ApiError:
    """The 409 of a transition the batch's current status does not allow."""
    current = await _find(request)
    names = " or ".join(s.value for s in JobStatus if s in allowed)
    return ApiError(409, f"batch is {current.status}: only a {names} batch can be {verb}", "id")


async def retry_batch(request: web.Request) -> web.Response:
    """``POST /v1/batches/{id}/retry``: 201 with a new batch of the terminal batch's
    failed (or dead-letter) rows; 409 on a batch that has not ended, 400 ``rows`` when
    there is none to retry. Honours ``Idempotency-Key``; then a dispatcher is woken."""
    deps = request.app[DEPS]
    workspace_id = request[WORKSPACE_ID]
    found = await _find(request)
    raw = b""
    if request.body_exists:
        async with deps.body_gate.admit(workspace_id) as ticket:
            raw = bytes(await read_body(request, JSON, RETRY_BODY_BYTES, ticket))
    claim = claim_for(request, workspace_id, raw)
    if (replayed := await stored_response(deps.idempotency, claim)) is not None:
        return replayed
    rows = retry_rows(raw)
    not_ended = ApiError(409, f"batch is {found.status}: only an ended batch can be retried", "id")
    if found.status not in TERMINAL:
        raise not_ended
    try:
        job = await deps.jobs.create_retry(workspace_id, found, rows, new_id(), claim)
    except ConflictError:
        raise not_ended from None
    except NothingToRetry:
        raise invalid(f"batch {found.id} has no {rows} rows to retry", "rows") from None
    except KeyTaken:
        return await raced_response(deps.idempotency, claim)
    log.info("batch_retried", extra={"batch_id": job.id, "retry_of": found.id, "total": job.total})
    JOB_TRANSITIONS.labels(job.status).inc()
    await wake(deps, job)
    return json_response(batch_object(job), status=201)


def retry_rows(raw: bytes) -> RetryRows:
    """The ``rows`` of a retry body (``failed`` when the body is empty or leaves it out);
    400 naming any other key, or ``rows`` when its value is not one of the choices."""
    if not raw.strip():
        return RetryRows.FAILED
    body = decode_json_object(raw)
    for key in body:
        if key != "rows":
            raise invalid(f"{key!r} is not a field of a retry (fields: rows)", key)
    value = body.get("rows", RetryRows.FAILED.value)
    choices = [r.value for r in RetryRows]
    if not isinstance(value, str) or value not in choices:
        raise invalid(f"rows must be one of {', '.join(choices)}", "rows")
    return RetryRows(value)
