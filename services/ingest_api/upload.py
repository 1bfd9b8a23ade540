"""``POST /v1/batches/upload``: multipart files, one job per file (API.md, "Panel upload").

The form carries every job-level field of ``POST /v1/batches`` (:data:`JOB_FIELDS`) as a
text part: ``priority`` as decimal digits, ``budget_usd`` a decimal number, ``params``
and ``metadata`` JSON-encoded, a blank field absent.
The handler is three steps, with the ``Idempotency-Key`` replay checked before the last two:

1. :func:`read_upload_form` streams the multipart parts, bounded by the body limit;
2. :func:`plan_jobs` validates the fields and every file (the same rules as
   ``POST /v1/batches``, in :mod:`.submit`) before anything is written, so one bad line
   creates no job;
3. :func:`.submit.submit_many` inserts all the jobs in one transaction, then wakes
   dispatchers.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Container
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import PurePosixPath

import orjson
from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.multipart import BadContentDispositionHeader, BadContentDispositionParam

from relay_batches.errors import ApiError, invalid
from relay_batches.ledger.idempotency import KeyTaken
from relay_batches.services.ingest_api.body import BodyTicket, body_errors, check_body, too_large
from relay_batches.services.ingest_api.deps import DEPS, ApiDeps
from relay_batches.services.ingest_api.idempotency import (
    claim_for,
    raced_response,
    stored_response,
)
from relay_batches.services.ingest_api.middleware import WORKSPACE_ID, json_response
from relay_batches.services.ingest_api.submit import (
    PlannedJob,
    job_fields,
    plan_job,
    row_models,
    submit_many,
)
from relay_batches.services.ingest_api.upload_formats import LineError, parse_upload_file
from relay_batches.services.ingest_api.validation import (
    JOB_FIELDS,
    MAX_NAME_CHARS,
    BatchOptions,
    RowInput,
    SubmitLimits,
    parse_budget_field,
    parse_priority_field,
)

FILE_FIELD = "file"
JSON_FIELDS = frozenset({"params", "metadata"})  # form fields holding a JSON-encoded value
MAX_FILES = 100
MAX_PARTS = MAX_FILES + 50
MAX_FIELD_BYTES = 8 * 1024  # a text field; a JSON field is bounded by the body limit only
MULTIPART = "multipart/form-data"
READ_CHUNK = 64 * 1024
_BAD_DISPOSITION = (BadContentDispositionHeader, BadContentDispositionParam)


@dataclass(frozen=True)
class UploadedFile:
    """One ``file`` part: its base name and its bytes."""

    filename: str
    data: bytes | bytearray


@dataclass(frozen=True)
class UploadForm:
    """The parts of an upload request that matter: the files and the option fields."""

    files: list[UploadedFile]
    fields: dict[str, str]


def add_upload_routes(app: web.Application) -> None:
    """Register ``POST /v1/batches/upload`` on ``app``."""
    app.router.add_post("/v1/batches/upload", upload_batches)


async def upload_batches(request: web.Request) -> web.Response:
    """Create one job per uploaded file; ``201 {object: list, data: [batch, …]}``."""
    deps = request.app[DEPS]
    workspace_id = request[WORKSPACE_ID]
    async with deps.body_gate.admit(workspace_id) as ticket:  # a large body holds its slot
        form = await read_upload_form(request, deps.max_body_bytes, ticket)
        claim = claim_for(request, workspace_id, canonical_form(form))
        if (replayed := await stored_response(deps.idempotency, claim)) is not None:
            return replayed
        now = datetime.now(UTC)
        loop = asyncio.get_running_loop()
        parser = deps.parser_for(ticket.large)
        planned = await loop.run_in_executor(parser, plan_jobs, form, deps, workspace_id, now)
        del form  # the validated rows are all that is kept while they are stored
        try:
            batches = await submit_many(deps, planned, claim)
        except KeyTaken:
            return await raced_response(deps.idempotency, claim)
    return json_response({"object": "list", "data": [b.to_api() for b in batches]}, status=201)


def canonical_form(form: UploadForm) -> bytes:
    """What an upload asked for, independent of its multipart boundary (for idempotency);
    a blank field is absent, as :func:`form_payload` reads it."""
    files = [[f.filename, hashlib.sha256(f.data).hexdigest()] for f in form.files]
    fields = sorted((name, text) for name, text in form.fields.items() if text.strip())
    return orjson.dumps({"fields": fields, "files": files})


# --- 1. read --------------------------------------------------------------------------


async def read_upload_form(request: web.Request, max_bytes: int, ticket: BodyTicket) -> UploadForm:
    """Stream the multipart body: 415 for another type, 413 past ``max_bytes``, 408
    when it stalls, 503 when it is large and every large-body slot is taken."""
    check_body(request, MULTIPART, max_bytes)
    ticket.grow(request.content_length or 0)
    try:
        with body_errors():
            return await _read_parts(request, max_bytes, ticket)
    except web.HTTPRequestEntityTooLarge:
        raise too_large(max_bytes) from None
    except (ValueError, RuntimeError, TypeError, HttpProcessingError, *_BAD_DISPOSITION) as exc:
        # aiohttp's errors for a malformed body or part headers (its warnings about a bad
        # Content-Disposition are raised only where warnings are errors, as in the tests)
        message = exc.message if isinstance(exc, HttpProcessingError) else str(exc)
        raise invalid(f"malformed multipart body: {_printable(message)}") from None


async def _read_parts(request: web.Request, max_bytes: int, ticket: BodyTicket) -> UploadForm:
    files: list[UploadedFile] = []
    fields: dict[str, str] = {}
    budget = max_bytes
    reader = await request.multipart()
    for _ in range(MAX_PARTS):
        part = await ticket.within(reader.next())
        if part is None:
            return UploadForm(files, fields)
        if not isinstance(part, BodyPartReader):
            raise invalid("nested multipart bodies are not supported")
        if part.name == FILE_FIELD and part.filename:
            data = await _read_limited(part, budget, too_large(max_bytes), ticket)
            files.append(UploadedFile(clean_filename(part.filename), data))
            if len(files) > MAX_FILES:
                raise invalid(f"at most {MAX_FILES} files per upload", FILE_FIELD)
        elif part.name in JSON_FIELDS:
            data = await _read_limited(part, budget, too_large(max_bytes), ticket)
            _add_field(fields, part.name, data)
        elif part.name in JOB_FIELDS:
            name = part.name
            error = invalid(f"{name} is too long", name)
            data = await _read_limited(part, MAX_FIELD_BYTES, error, ticket)
            _add_field(fields, name, data)
        elif part.name == FILE_FIELD:  # an empty file input: read and dropped
            budget -= await _drain(part, budget, too_large(max_bytes), ticket)
            continue
        else:
            raise _unknown_field(part.name)
        budget -= len(data)
    raise invalid(f"at most {MAX_PARTS} parts per upload")


def _unknown_field(name: str | None) -> ApiError:
    known = ", ".join(sorted({*JOB_FIELDS, FILE_FIELD}))
    if not name:
        return invalid(f"every form part needs a name (fields: {known})")
    shown = _printable(name, 64)
    return invalid(f"{shown!r} is not a field of an upload (fields: {known})", shown)


async def _chunk(part: BodyPartReader, ticket: BodyTicket) -> bytes:
    """The part's next chunk, counted on ``ticket`` (so a large part takes its slot as it
    grows, chunked or not)."""
    chunk = await ticket.within(part.read_chunk(READ_CHUNK))
    ticket.count(len(chunk))
    return chunk


async def _read_limited(
    part: BodyPartReader, limit: int, error: ApiError, ticket: BodyTicket
) -> bytearray:
    buffer = bytearray()
    while chunk := await _chunk(part, ticket):
        if len(buffer) + len(chunk) > limit:
            raise error
        buffer += chunk
    return buffer


async def _drain(part: BodyPartReader, limit: int, error: ApiError, ticket: BodyTicket) -> int:
    size = 0
    while chunk := await _chunk(part, ticket):
        size += len(chunk)
        if size > limit:
            raise error
    return size


def _add_field(fields: dict[str, str], name: str, data: bytes | bytearray) -> None:
    """A form field is UTF-8 text; a text field one line (the ledger cannot store a NUL).

    A JSON field may span lines: its text is checked when it is decoded.
    """
    if name in fields:
        raise invalid(f"{name} is given more than once", name)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise invalid(f"{name} must be UTF-8 text", name) from None
    if name not in JSON_FIELDS and not text.isprintable():
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
    """Validate the fields and every file; one :class:`PlannedJob` per file, in order.

    Without a ``model`` field each job's model is its file's first row's own ``model``
    (an OpenAI or Anthropic line always names one).
    """
    payload = form_payload(form.fields)
    options = job_fields(payload, deps) if "model" in payload else None
    if not form.files:
        raise invalid("at least one file (.csv or .jsonl) is required", FILE_FIELD)
    known = row_models(deps)
    planned = []
    for index, upload in enumerate(form.files):
        rows = _file_rows(index, upload, deps.limits, known)
        job = options if options is not None else _row_model_options(payload, rows, deps)
        name = job_name(job.name, upload.filename, len(form.files))
        planned.append(plan_job(job, rows, workspace_id, now, name))
    return planned


def _row_model_options(
    payload: dict[str, object], rows: list[RowInput], deps: ApiDeps
) -> BatchOptions:
    """The job-level fields with the file's first row's model as the job's."""
    if rows[0].model is None:
        raise invalid(
            "model is required: give the model field, or a model in every row of the file"
            " (OpenAI and Anthropic lines always carry one)",
            "model",
        )
    return job_fields({**payload, "model": rows[0].model}, deps)


def form_payload(fields: dict[str, str]) -> dict[str, object]:
    """The form's text fields as the values of a ``POST /v1/batches`` body.

    A blank field is absent; ``priority`` is parsed as an integer, ``budget_usd`` as a
    number and each JSON field decoded (400 naming the field if it is not JSON), so the
    job-level rules then see the same values, and give the same errors, as for a JSON
    body.
    """
    payload: dict[str, object] = {}
    for name, text in fields.items():
        if not text.strip():
            continue
        if name == "priority":
            payload[name] = parse_priority_field(text)
        elif name == "budget_usd":
            payload[name] = parse_budget_field(text)
        elif name in JSON_FIELDS:
            payload[name] = _json_field(name, text)
        else:
            payload[name] = text
    return payload


def _json_field(name: str, text: str) -> object:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        raise invalid(f"{name} must be JSON text", name) from None


def _file_rows(
    index: int, upload: UploadedFile, limits: SubmitLimits, known: Container[str]
) -> list[RowInput]:
    try:
        return parse_upload_file(upload.filename, upload.data, limits, known)
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
