"""``/openai/v1/batches``: create a batch from an uploaded file, retrieve, list, cancel.

A batch here is an ordinary job (created through :mod:`.submit`, visible in the native
API, the panel, metrics and webhooks) whose rows are its input file's, run in place;
the OpenAI surface keeps beside it a link (input file, the ids its output and error
files get, endpoint, window). Its id is ``batch_<the job's 32 hex>``.

Statuses: a queued or running job is ``in_progress`` (``finalizing`` once every row has
an outcome but the job is not yet marked); completed, failed, canceled and expired jobs
are ``completed``, ``failed``, ``cancelled`` and ``expired``. Validation runs when the
file is uploaded, so ``validating`` is never seen; cancel is immediate, so neither is
``cancelling`` (``cancelling_at`` equals ``cancelled_at``). A file that failed
validation gives a ``failed`` batch with its ``errors`` (line numbers).
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import orjson
from aiohttp import web
from pydantic import ValidationError

from relay_batches.dialects.endpoints import ALL_ENDPOINTS
from relay_batches.dialects.openai.render import BATCH_PREFIX, ERROR, OUTPUT
from relay_batches.dialects.openai.shapes import (
    CHAT_ENDPOINT,
    BatchStatus,
    OpenAIBatch,
    OpenAIBatchErrors,
    OpenAIBatchList,
    OpenAIBatchUsage,
    OpenAICreateBatch,
    OpenAIRequestCounts,
    validation_error,
)
from relay_batches.errors import ApiError, ConflictError, invalid
from relay_batches.ids import is_valid_id, new_id
from relay_batches.ledger.files import INPUT_PURPOSE, BatchLink, LinkedBatch
from relay_batches.ledger.idempotency import IdempotencyClaim
from relay_batches.metrics import JOB_TRANSITIONS
from relay_batches.model import TERMINAL, JobStatus
from relay_batches.services.ingest_api.create import Creation, as_read, create
from relay_batches.services.ingest_api.deps import DEPS, ApiDeps
from relay_batches.services.ingest_api.edge.body import BodyTicket, read_body
from relay_batches.services.ingest_api.edge.idempotency import HEADER
from relay_batches.services.ingest_api.edge.middleware import WORKSPACE_ID, json_response
from relay_batches.services.ingest_api.edge.paging import page_limit
from relay_batches.services.ingest_api.rows.job_fields import (
    MAX_NAME_CHARS,
    BatchOptions,
    completion_window,
    validate_metadata,
)
from relay_batches.services.ingest_api.rows.validation import decode_json_object
from relay_batches.services.ingest_api.submit import (
    job_fields,
    plan_stored_job,
)
from relay_batches.services.ingest_api.surfaces.openai.files import FILE_PREFIX, file_hex
from relay_batches.services.ingest_api.surfaces.openai.output import (
    output_file,
    output_files,
)

log = logging.getLogger("relay.ingest_api")

JSON = "application/json"
MAX_CREATE_BYTES = 64 * 1024
DEFAULT_PAGE = 20
MAX_PAGE = 100
NO_MODEL = "none"  # the model of a batch whose input has no valid line
_STATUSES: dict[JobStatus, BatchStatus] = {
    JobStatus.QUEUED: "in_progress",
    JobStatus.RUNNING: "in_progress",
    JobStatus.COMPLETED: "completed",
    JobStatus.FAILED: "failed",
    JobStatus.CANCELED: "cancelled",
    JobStatus.EXPIRED: "expired",
}


def batch_hex(batch_id: str) -> str | None:
    """The 32-hex id inside ``batch_<hex>``, None if it is not one."""
    hex_id = batch_id.removeprefix(BATCH_PREFIX)
    return hex_id if batch_id.startswith(BATCH_PREFIX) and is_valid_id(hex_id) else None


def _unix(ts: datetime | None) -> int | None:
    return None if ts is None else int(ts.timestamp())


def status_of(linked: LinkedBatch) -> BatchStatus:
    """The OpenAI status of a linked job."""
    job = linked.job
    if job.status == JobStatus.RUNNING and job.completed + job.failed >= job.total:
        return "finalizing"
    return _STATUSES.get(job.status, "in_progress")


def batch_object(linked: LinkedBatch) -> OpenAIBatch:
    """The batch as OpenAI shapes it; every time in Unix seconds."""
    job, link = linked.job, linked.link
    status = status_of(linked)
    ended = _unix(job.completed_at)
    files = output_files(linked)
    failed_input = link.errors is not None
    counts = (
        OpenAIRequestCounts(total=0, completed=0, failed=0)
        if failed_input
        else OpenAIRequestCounts(total=job.total, completed=job.completed, failed=job.failed)
    )
    return OpenAIBatch(
        id=BATCH_PREFIX + job.id,
        endpoint=link.endpoint,
        errors=OpenAIBatchErrors(data=orjson.loads(link.errors)) if link.errors else None,
        input_file_id=FILE_PREFIX + link.input_file_id,
        completion_window=link.completion_window,
        status=status,
        output_file_id=None if files.output is None else FILE_PREFIX + files.output,
        error_file_id=None if files.error is None else FILE_PREFIX + files.error,
        created_at=int(job.created_at.timestamp()),
        in_progress_at=None if failed_input else int(job.created_at.timestamp()),
        expires_at=_unix(job.expires_at),
        finalizing_at=ended if status == "completed" else None,
        completed_at=ended if status == "completed" else None,
        failed_at=ended if status == "failed" else None,
        expired_at=ended if status == "expired" else None,
        cancelling_at=ended if status == "cancelled" else None,
        cancelled_at=ended if status == "cancelled" else None,
        request_counts=counts,
        metadata=None if job.metadata is None else orjson.loads(job.metadata),
        model=job.model,
        usage=OpenAIBatchUsage(
            input_tokens=job.prompt_tokens,
            output_tokens=job.completion_tokens,
            total_tokens=job.prompt_tokens + job.completion_tokens,
        ),
    )


def _answer(linked: LinkedBatch) -> web.Response:
    return json_response(batch_object(linked).model_dump())


# --- create -----------------------------------------------------------------------


def parse_create(raw: bytes | bytearray) -> OpenAICreateBatch:
    """The ``POST /batches`` body, validated; a 400 naming the field otherwise."""
    payload = decode_json_object(raw)
    if "output_expires_after" in payload:
        raise invalid(
            "output_expires_after is not supported: output files are kept until deleted",
            "output_expires_after",
        )
    try:
        body = OpenAICreateBatch.model_validate(payload)
    except ValidationError as exc:
        raise validation_error(exc) from None
    if body.endpoint not in ALL_ENDPOINTS:
        raise invalid(
            f"endpoint must be one of {', '.join(ALL_ENDPOINTS)} (the endpoints Relay runs)",
            "endpoint",
        )
    return body


async def create_batch(request: web.Request) -> web.Response:
    """``POST /batches``: a job over the input file's rows, queued at once; a file that
    failed validation gives a ``failed`` batch with its errors."""
    return await create(request, CREATE)


async def _read(request: web.Request, deps: ApiDeps, ticket: BodyTicket, _: ExitStack) -> bytearray:
    return await read_body(request, JSON, MAX_CREATE_BYTES, ticket)


@dataclass(frozen=True)
class _Create:
    """A validated create body, with who asked and when."""

    body: OpenAICreateBatch
    window: timedelta
    metadata: str | None
    workspace_id: str
    now: datetime


def _plan(raw: bytearray, deps: ApiDeps, workspace_id: str, now: datetime) -> _Create:
    body = parse_create(raw)
    window = completion_window(body.completion_window, "completion_window")
    return _Create(body, window, validate_metadata(body.metadata), workspace_id, now)


async def _store(
    deps: ApiDeps, plan: _Create, claim: IdempotencyClaim | None, _: bool
) -> LinkedBatch:
    """The job over the input file's rows and its link, stored with ``claim``."""
    body, window, metadata = plan.body, plan.window, plan.metadata
    workspace_id, now = plan.workspace_id, plan.now
    hex_id = file_hex(body.input_file_id)
    stored = None if hex_id is None else await deps.files.get(workspace_id, hex_id)
    if stored is None or stored.purpose != INPUT_PURPOSE:
        raise ApiError(404, f"No such input file: {body.input_file_id[:80]!r}", "input_file_id")
    name = stored.filename[:MAX_NAME_CHARS] or None
    line_errors = stored.line_errors
    if line_errors is None and (stored.endpoint or CHAT_ENDPOINT) != body.endpoint:
        line_errors = _url_mismatch(stored.endpoint or CHAT_ENDPOINT, body.endpoint)
    if line_errors is None:
        options = job_fields({"model": stored.model, "name": name}, deps)
    else:
        options = BatchOptions(name, stored.model or NO_MODEL, 0, None, None)
    options = replace(
        options, completion_window=window, metadata_json=metadata, endpoint=body.endpoint
    )
    # A file that failed validation keeps no rows: its job counts it as one failed
    # request (a job has at least one), which never runs and has no result row.
    total = stored.rows if line_errors is None else 1
    planned = plan_stored_job(options, stored.id, total, workspace_id, now)
    link = BatchLink(
        planned.new.id,
        stored.id,
        new_id(),
        new_id(),
        body.endpoint,
        body.completion_window,
        line_errors,
    )
    linked: LinkedBatch | None
    if line_errors is not None:
        linked = await deps.files.create_failed(planned.new, link, claim)
    else:
        linked = await deps.files.create_linked(planned.new, link, claim)
    if linked is None:
        raise ApiError(404, f"No such input file: {body.input_file_id[:80]!r}", "input_file_id")
    return linked


def _url_mismatch(lines: str, endpoint: str) -> str:
    """The errors of a batch whose file's lines name another url than its endpoint."""
    message = f"The file's lines name {lines}, not the batch's endpoint {endpoint}."
    error = {"code": "invalid_url", "message": message, "param": "url", "line": 1}
    return orjson.dumps([error]).decode()


async def _replay(
    request: web.Request, deps: ApiDeps, claim: IdempotencyClaim
) -> web.Response | None:
    replayed = await _replayed(deps, claim.workspace_id, claim.key)
    if replayed is None:
        return None
    _check_same(replayed[1], claim.request_hash, claim.key)
    return replayed[0]


async def _raced(
    request: web.Request, deps: ApiDeps, claim: IdempotencyClaim
) -> web.Response | None:
    raced = await _replayed(deps, claim.workspace_id, claim.key)
    return None if raced is None else raced[0]


CREATE = Creation(
    _read,
    as_read,
    _plan,
    _store,
    lambda linked: (linked.job,),
    lambda _, linked: _answer(linked),
    _replay,
    _raced,
)


async def _replayed(
    deps: ApiDeps, workspace_id: str, key: str
) -> tuple[web.Response, bytes] | None:
    """The batch an earlier request with this ``Idempotency-Key`` created, as it is now
    (with that request's hash), None if the key is unused."""
    found = await deps.idempotency.find(workspace_id, key)
    if found is None:
        return None
    batch_id = orjson.loads(found.body).get("id")
    linked = await deps.files.batch(workspace_id, batch_id) if type(batch_id) is str else None
    if linked is None:
        raise ApiError(409, f"{HEADER} {key!r} was already used for another request", HEADER)
    response = _answer(linked)
    response.headers["Idempotent-Replayed"] = "true"
    return response, found.request_hash


def _check_same(stored_hash: bytes, request_hash: bytes, key: str) -> None:
    if stored_hash != request_hash:
        raise ApiError(409, f"{HEADER} {key!r} was already used with a different request", HEADER)


# --- read, list, cancel -----------------------------------------------------------


async def _find(request: web.Request) -> LinkedBatch:
    raw = request.match_info["batch_id"]
    hex_id = batch_hex(raw)
    linked = None
    if hex_id is not None:
        linked = await request.app[DEPS].files.batch(request[WORKSPACE_ID], hex_id)
    if linked is None:
        raise ApiError(404, f"No such Batch object: {raw[:80]!r}", "batch_id")
    return linked


async def get_batch(request: web.Request) -> web.Response:
    """``GET /batches/{batch_id}``; an ended batch's output and error files are
    registered (their size measured) the first time it is retrieved."""
    linked = await _find(request)
    deps = request.app[DEPS]
    files = output_files(linked)
    for kind, file_id in ((OUTPUT, files.output), (ERROR, files.error)):
        if file_id is not None:
            await output_file(deps, linked, kind)
    return _answer(linked)


async def list_batches(request: web.Request) -> web.Response:
    """``GET /batches``: newest first; ``limit`` (1–100, default 20) and ``after``."""
    query = request.query
    limit = page_limit(query.get("limit"), DEFAULT_PAGE, MAX_PAGE)
    after = query.get("after")
    after_hex = None if after is None else batch_hex(after)
    if after is not None and after_hex is None:
        raise invalid("after must be a batch id", "after")
    page, more = await request.app[DEPS].files.batch_page(request[WORKSPACE_ID], limit, after_hex)
    data = [batch_object(b) for b in page]
    listing = OpenAIBatchList(
        data=data,
        has_more=more,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
    )
    return json_response(listing.model_dump())


async def cancel_batch(request: web.Request) -> web.Response:
    """``POST /batches/{batch_id}/cancel``: the batch, ``cancelled``; a batch already
    cancelled is answered as it is, one that ended otherwise is a 409."""
    deps = request.app[DEPS]
    linked = await _find(request)
    job = linked.job
    if job.status not in TERMINAL:
        try:
            job = await deps.jobs.cancel(request[WORKSPACE_ID], job.id)
        except ConflictError:
            linked = await _find(request)
        else:
            linked = LinkedBatch(job, linked.link)
            log.info("batch_canceled", extra={"batch_id": job.id})
            JOB_TRANSITIONS.labels(job.status).inc()
            await _announce_cancel(deps, linked)
    if linked.job.status != JobStatus.CANCELED:
        raise ApiError(409, f"batch is already {status_of(linked)}", "batch_id")
    return _answer(linked)


async def _announce_cancel(deps: ApiDeps, linked: LinkedBatch) -> None:
    try:
        await deps.announcer.job_canceled(linked.job)
    except Exception as exc:
        # Committed; the aggregator's outbox scan announces the finish later.
        log.warning("cancel_announce_failed", extra={"batch_id": linked.job.id, "error": repr(exc)})


def add_batch_routes(app: web.Application) -> None:
    """Register the ``/openai/v1/batches`` routes on ``app``."""
    app.router.add_post("/batches", create_batch)
    app.router.add_get("/batches", list_batches)
    app.router.add_get("/batches/{batch_id}", get_batch)
    app.router.add_post("/batches/{batch_id}/cancel", cancel_batch)
