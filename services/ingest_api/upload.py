"""``POST /v1/batches/upload``: multipart files, one job per file (API.md, "Panel upload").

The handler is three steps, so a later ``Idempotency-Key`` check wraps the last one:

1. :func:`read_upload_form` streams the multipart parts, bounded by the body limit;
2. :func:`plan_jobs` validates the options and every file (the same rules as
   ``POST /v1/batches``) before anything is written, so one bad line creates no job;
3. :func:`create_jobs` inserts all the jobs in one transaction, then wakes dispatchers.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import PurePosixPath

import orjson
from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.multipart import BadContentDispositionHeader, BadContentDispositionParam
from relay_batches.services.ingest_api.idempotency import idempotent
from relay_batches.services.ingest_api.middleware import WORKSPACE_ID, json_response
from relay_batches.services.ingest_api.routes import DEPS, ApiDeps, wake
from relay_batches.services.ingest_api.upload_formats import LineError, parse_upload_file
from relay_batches.services.ingest_api.validation import (
    MAX_NAME_CHARS,
    BatchOptions,
    KnownModels,
    RowInput,
    SubmitLimits,
    parse_priority_field,
    validate_batch_options,
)

from relay_batches.cron import next_tick
from relay_batches.errors import ApiError, invalid
from relay_batches.ids import new_id
from relay_batches.ledger.idempotency import IdempotencyClaim
from relay_batches.ledger.jobs import NewJob
from relay_batches.metrics import JOB_TRANSITIONS
from relay_batches.model import Job

log = logging.getLogger("relay.ingest_api")

FILE_FIELD = "file"
OPTION_FIELDS = ("model", "priority", "name", "webhookUrl", "cron")
MAX_FILES = 100
MAX_PARTS = MAX_FILES + 50
MAX_FIELD_BYTES = 8 * 1024
READ_CHUNK = 64 * 1024
_BAD_DISPOSITION = (BadContentDispositionHeader, BadContentDispositionParam)


@dataclass(frozen=True)
class UploadedFile:
    """One ``file`` part: its base name and its bytes."""

    filename: str
    data: bytes


@dataclass(frozen=True)
class UploadForm:
    """The parts of an upload request that matter: the files and the option fields."""

    files: list[UploadedFile]
    fields: dict[str, str]


@dataclass(frozen=True)
class PlannedJob:
    """A validated job, ready to insert."""

    new: NewJob
    rows: list[RowInput]


def add_upload_routes(app: web.Application) -> None:
    """Register ``POST /v1/batches/upload`` on ``app``."""
    app.router.add_post("/v1/batches/upload", upload_batches)


async def upload_batches(request: web.Request) -> web.Response:
    """Create one job per uploaded file; ``201 {object: list, data: [batch, …]}``."""
    deps = request.app[DEPS]
    form = await read_upload_form(request, deps.max_body_bytes)
    workspace_id = request[WORKSPACE_ID]

    async def respond(claim: IdempotencyClaim | None) -> web.Response:
        planned = plan_jobs(form, deps, workspace_id, datetime.now(UTC))
        batches = await create_jobs(deps, planned, claim)
        body = {"object": "list", "data": [b.to_api() for b in batches]}
        return json_response(body, status=201)

    return await idempotent(request, deps.idempotency, workspace_id, canonical_form(form), respond)


def canonical_form(form: UploadForm) -> bytes:
    """What an upload asked for, independent of its multipart boundary (for idempotency)."""
    files = [[f.filename, hashlib.sha256(f.data).hexdigest()] for f in form.files]
    return orjson.dumps({"fields": sorted(form.fields.items()), "files": files})


# --- 1. read --------------------------------------------------------------------------


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"request body exceeds {max_bytes} bytes")


async def read_upload_form(request: web.Request, max_bytes: int) -> UploadForm:
    """Stream the multipart body: 415 for another type, 413 past ``max_bytes``."""
    if request.content_type != "multipart/form-data":
        raise ApiError(415, "Content-Type must be multipart/form-data")
    if request.content_length is not None and request.content_length > max_bytes:
        raise _too_large(max_bytes)
    try:
        return await _read_parts(request, max_bytes)
    except web.HTTPRequestEntityTooLarge:
        raise _too_large(max_bytes) from None
    except (ValueError, RuntimeError, TypeError, HttpProcessingError, *_BAD_DISPOSITION) as exc:
        # aiohttp's errors for a malformed body or part headers (its warnings about a bad
        # Content-Disposition are raised only where warnings are errors, as in the tests)
        message = exc.message if isinstance(exc, HttpProcessingError) else str(exc)
        raise invalid(f"malformed multipart body: {_printable(message)}") from None


async def _read_parts(request: web.Request, max_bytes: int) -> UploadForm:
    files: list[UploadedFile] = []
    fields: dict[str, str] = {}
    budget = max_bytes
    reader = await request.multipart()
    for _ in range(MAX_PARTS):
        part = await reader.next()
        if part is None:
            return UploadForm(files, fields)
        if not isinstance(part, BodyPartReader):
            raise invalid("nested multipart bodies are not supported")
        if part.name == FILE_FIELD and part.filename:
            data = await _read_limited(part, budget, _too_large(max_bytes))
            files.append(UploadedFile(clean_filename(part.filename), data))
            if len(files) > MAX_FILES:
                raise invalid(f"at most {MAX_FILES} files per upload", FILE_FIELD)
        elif part.name in OPTION_FIELDS:
            name = part.name
            data = await _read_limited(part, MAX_FIELD_BYTES, invalid(f"{name} is too long", name))
            _add_field(fields, name, data)
        else:  # unknown parts and empty file inputs are read and dropped
            budget -= await _drain(part, budget, _too_large(max_bytes))
            continue
        budget -= len(data)
    raise invalid(f"at most {MAX_PARTS} parts per upload")


async def _read_limited(part: BodyPartReader, limit: int, error: ApiError) -> bytes:
    buffer = bytearray()
    while chunk := await part.read_chunk(READ_CHUNK):
        if len(buffer) + len(chunk) > limit:
            raise error
        buffer += chunk
    return bytes(buffer)


async def _drain(part: BodyPartReader, limit: int, error: ApiError) -> int:
    size = 0
    while chunk := await part.read_chunk(READ_CHUNK):
        size += len(chunk)
        if size > limit:
            raise error
    return size


def _add_field(fields: dict[str, str], name: str, data: bytes) -> None:
    """A form field is one line of UTF-8 text (the ledger cannot store a NUL)."""
    if name in fields:
        raise invalid(f"{name} is given more than once", name)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise invalid(f"{name} must be UTF-8 text", name) from None
    if not text.isprintable():
        raise invalid(f"{name} must be one line of text without control characters", name)
    fields[name] = text


def _printable(text: str, limit: int = 200) -> str:
    return "".join(ch for ch in text[:limit] if ch.isprintable())


def clean_filename(filename: str) -> str:
    """The last path component (clients may send a full path), printable characters only.

    The name ends up as the job's name in the ledger, where a NUL cannot be stored.
    """
    base = PurePosixPath(filename.replace("\\", "/")).name or filename
    return _printable(base, len(base))


# --- 2. validate ----------------------------------------------------------------------


def plan_jobs(
    form: UploadForm, deps: ApiDeps, workspace_id: str, now: datetime
) -> list[PlannedJob]:
    """Validate the options and every file; one :class:`PlannedJob` per file, in order."""
    options = validate_upload_options(form.fields, KnownModels(deps.model_known))
    if not form.files:
        raise invalid("at least one file (.csv or .jsonl) is required", FILE_FIELD)
    planned = []
    for index, upload in enumerate(form.files):
        rows = _file_rows(index, upload, deps.limits)
        name = job_name(options.name, upload.filename, len(form.files))
        planned.append(PlannedJob(_new_batch(options, name, len(rows), workspace_id, now), rows))
    return planned


def validate_upload_options(fields: dict[str, str], known_models: KnownModels) -> BatchOptions:
    """The form fields by the rules of ``POST /v1/batches``; a blank field is absent."""
    payload: dict[str, object] = {k: v for k, v in fields.items() if v.strip()}
    if "priority" in payload:
        payload["priority"] = parse_priority_field(fields["priority"])
    return validate_batch_options(payload, known_models)


def _file_rows(index: int, upload: UploadedFile, limits: SubmitLimits) -> list[RowInput]:
    try:
        return parse_upload_file(upload.filename, upload.data, limits)
    except LineError as exc:
        where = (
            f"{upload.filename!r}" if exc.line is None else f"{upload.filename!r} line {exc.line}"
        )
        raise invalid(f"{where}: {exc.reason}", f"{FILE_FIELD}[{index}]") from None


def job_name(name: str | None, filename: str, files: int) -> str:
    """The job's name: the file name; or ``name``, followed by the file name when several."""
    if name is None:
        full = filename
    elif files == 1:
        full = name
    else:
        full = f"{name} — {filename}"
    return full[:MAX_NAME_CHARS]


def _new_batch(
    options: BatchOptions, name: str, total: int, workspace_id: str, now: datetime
) -> NewJob:
    return NewJob(
        id=new_id(),
        workspace_id=workspace_id,
        name=name,
        model=options.model,
        priority=options.priority,
        total=total,
        webhook_url=options.webhook_url,
        cron=options.cron,
        next_run_at=next_tick(options.cron, now) if options.cron else None,
    )


# --- 3. create ------------------------------------------------------------------------


async def create_jobs(
    deps: ApiDeps, planned: list[PlannedJob], claim: IdempotencyClaim | None = None
) -> list[Job]:
    """Insert every planned job in one transaction, then wake a dispatcher for each."""
    batches = await deps.jobs.create_many(
        [(job.new, ((r.custom_id, r.messages_json) for r in job.rows)) for job in planned],
        claim,
    )
    for batch in batches:
        JOB_TRANSITIONS.labels(batch.status).inc()
        log.info("batch_created", extra={"batch_id": batch.id, "total": batch.total})
        await wake(deps, batch)
    return batches
