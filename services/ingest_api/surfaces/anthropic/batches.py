"""The Anthropic-compatible Message Batches surface under ``/anthropic/v1/messages/batches``.

A client of the official SDK sets ``base_url`` to ``http://host/anthropic`` and a Relay
key as its ``api_key`` (sent as ``x-api-key``; ``Authorization: Bearer`` works too); the
``anthropic-version`` and ``anthropic-beta`` headers are accepted and change nothing.
Every job created here is an ordinary job, and every job of the workspace shows here.
An id that is not ``msgbatch_<32 hex>``, or names another workspace's job, is a 404.
Errors are Anthropic's error object (:mod:`.middleware`).
"""

from __future__ import annotations

import logging

import orjson
from aiohttp import web

from relay_batches.dialects.anthropic.render import (
    BATCHES_PATH,
    batch_object,
    job_id_of,
    public_id,
    result_line,
)
from relay_batches.errors import ApiError, ConflictError, invalid
from relay_batches.ledger.deletion import Deleted, JobDeletion, StillLive
from relay_batches.ledger.idempotency import IdempotencyClaim
from relay_batches.ledger.job_window import JobWindow
from relay_batches.metrics import JOB_TRANSITIONS
from relay_batches.model import CANCELABLE, TERMINAL, Job
from relay_batches.services.ingest_api.create import Creation, as_read, create, one_job, read_json
from relay_batches.services.ingest_api.deps import DEPS, ApiDeps
from relay_batches.services.ingest_api.edge.idempotency import HEADER
from relay_batches.services.ingest_api.edge.middleware import STREAMING, WORKSPACE_ID, json_response
from relay_batches.services.ingest_api.edge.paging import page_limit
from relay_batches.services.ingest_api.submit import store_one
from relay_batches.services.ingest_api.surfaces.anthropic import PREFIX
from relay_batches.services.ingest_api.surfaces.anthropic.create import plan_batch

log = logging.getLogger("relay.ingest_api")

JSON = "application/json"
JSONL = "application/x-jsonl"
DEFAULT_PAGE = 20
MAX_PAGE = 1000

BATCHES = BATCHES_PATH.removeprefix(PREFIX)  # the route within this sub-application


def add_anthropic_routes(app: web.Application) -> None:
    """Register every route of the Anthropic-compatible surface on ``app``."""
    app.router.add_post(BATCHES, create_batch)
    app.router.add_get(BATCHES, list_batches)
    app.router.add_get(f"{BATCHES}/{{id}}", get_batch)
    app.router.add_delete(f"{BATCHES}/{{id}}", delete_batch)
    app.router.add_post(f"{BATCHES}/{{id}}/cancel", cancel_batch)
    app.router.add_get(f"{BATCHES}/{{id}}/results", get_results)


def _origin(request: web.Request) -> str:
    """The root of ``results_url``: RELAY_PUBLIC_BASE_URL, else the request's origin."""
    return request.app[DEPS].public_base_url or str(request.url.origin())


def _answer(request: web.Request, job: Job) -> web.Response:
    return json_response(batch_object(job, _origin(request)))


async def create_batch(request: web.Request) -> web.Response:
    """``POST``: translate the requests, store the job with COPY, wake a dispatcher."""
    return await create(request, CREATE)


async def _replayed(
    request: web.Request, deps: ApiDeps, claim: IdempotencyClaim
) -> web.Response | None:
    """The batch a first request with this ``Idempotency-Key`` created, as it is now;
    None when the key is new. The stored response names the job (native shape)."""
    stored = await deps.idempotency.find(claim.workspace_id, claim.key)
    if stored is None:
        return None
    if stored.request_hash != claim.request_hash:
        raise ApiError(409, f"{HEADER} {claim.key!r} was already used with a different request")
    job = await deps.jobs.get(claim.workspace_id, str(orjson.loads(stored.body)["id"]))
    if job is None:
        return None
    response = _answer(request, job)
    response.headers["Idempotent-Replayed"] = "true"
    return response


CREATE = Creation(read_json, as_read, plan_batch, store_one, one_job, _answer, _replayed, _replayed)


async def _find(request: web.Request) -> Job:
    batch_id = request.match_info["id"]
    job_id = job_id_of(batch_id)
    job = None
    if job_id is not None:
        job = await request.app[DEPS].jobs.get(request[WORKSPACE_ID], job_id)
    if job is None:
        raise ApiError(404, f"no message batch {batch_id[:80]!r}")
    return job


async def get_batch(request: web.Request) -> web.Response:
    """``GET {id}``: the batch; poll it until ``processing_status`` is ``ended``."""
    return _answer(request, await _find(request))


async def list_batches(request: web.Request) -> web.Response:
    """``GET``: newest first; ``limit`` (1–1000), ``after_id`` (older) or ``before_id``
    (newer), ``has_more`` in the direction asked, ``first_id``/``last_id`` of the page."""
    query = request.query
    limit = page_limit(query.get("limit"), DEFAULT_PAGE, MAX_PAGE, "limit:")
    after = _cursor(query.get("after_id"), "after_id")
    before = _cursor(query.get("before_id"), "before_id")
    if after is not None and before is not None:
        raise invalid("after_id and before_id cannot both be given", "before_id")
    window = JobWindow(request.app[DEPS].pool)
    workspace_id = request[WORKSPACE_ID]
    if before is not None:
        page, more = await window.newer(workspace_id, limit, before)
    else:
        page, more = await window.older(workspace_id, limit, after)
    origin = _origin(request)
    return json_response(
        {
            "data": [batch_object(job, origin) for job in page],
            "has_more": more,
            "first_id": public_id(page[0].id) if page else None,
            "last_id": public_id(page[-1].id) if page else None,
        }
    )


def _cursor(value: str | None, name: str) -> str | None:
    if value is None:
        return None
    job_id = job_id_of(value)
    if job_id is None:
        raise invalid(f"{name}: must be a message batch id (msgbatch_…)", name)
    return job_id


async def cancel_batch(request: web.Request) -> web.Response:
    """``POST {id}/cancel``: the batch, ``ended`` with ``cancel_initiated_at`` (a cancel is
    synchronous); a batch that has already ended is returned as it is."""
    deps = request.app[DEPS]
    job = await _find(request)
    if job.status not in CANCELABLE:
        return _answer(request, job)
    try:
        job = await deps.jobs.cancel(request[WORKSPACE_ID], job.id)
    except ConflictError:  # it ended meanwhile
        return _answer(request, await _find(request))
    log.info("batch_canceled", extra={"batch_id": job.id})
    JOB_TRANSITIONS.labels(job.status).inc()
    try:
        await deps.announcer.job_canceled(job)
    except Exception as exc:
        # Committed; the aggregator's outbox scan announces the finish later.
        log.warning("cancel_announce_failed", extra={"batch_id": job.id, "error": repr(exc)})
    return _answer(request, job)


async def delete_batch(request: web.Request) -> web.Response:
    """``DELETE {id}``: an ended batch and everything stored for it; 409 before it ends."""
    job = await _find(request)
    deletion = JobDeletion(request.app[DEPS].pool)
    try:
        done = await deletion.delete(request[WORKSPACE_ID], job.id)
    except StillLive:
        raise ApiError(
            409, f"{public_id(job.id)} has not ended: cancel it, or wait for it to end, first"
        ) from None
    if done is Deleted.NOT_FOUND:  # deleted by a concurrent request
        raise ApiError(404, f"no message batch {public_id(job.id)!r}")
    log.info("batch_deleted", extra={"batch_id": job.id})
    return json_response({"id": public_id(job.id), "type": "message_batch_deleted"})


async def get_results(request: web.Request) -> web.StreamResponse:
    """``GET {id}/results``: one JSON line per request, in request order, streamed from
    the ledger a page at a time; 409 until the batch has ended."""
    job = await _find(request)
    if job.status not in TERMINAL:
        raise ApiError(409, f"{public_id(job.id)} has not ended: its results are not ready")
    pages = request.app[DEPS].jobs.answered_pages(job)
    response = web.StreamResponse(headers={"Content-Type": JSONL})
    await response.prepare(request)
    request[STREAMING] = True  # from here on a failure can only abort the connection
    dumps = orjson.dumps
    async for page in pages:
        await response.write(b"".join(dumps(result_line(job, row)) + b"\n" for row in page))
    await response.write_eof()
    return response
