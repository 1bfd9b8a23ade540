"""``POST /v1/batches/upload``: multipart files, one job per file (docs/api/native.md).

The form carries every job-level field of ``POST /v1/batches`` (:data:`JOB_FIELDS`) as a
text part: ``priority`` as decimal digits, ``budget_usd`` a decimal number, ``params``
and ``metadata`` JSON-encoded, a blank field absent.
The handler is three steps, with the ``Idempotency-Key`` replay checked before the last two:

1. :func:`read_upload_form` streams the multipart parts, bounded by the body limit, each
   file spooled to an anonymous temporary file (in ``ApiDeps.spool_dir``; gone when the
   request ends), so no file is held in memory and a slow client holds no connection;
2. :func:`form_options` validates the job-level fields (the rules of
   ``POST /v1/batches``, in :mod:`.submit`);
3. :func:`store_upload` reads every file a chunk of validated rows at a time (in the
   parser executor, :class:`..rows.files.FileReader`) and COPYs each chunk before it
   reads the next, all the jobs in one transaction: one bad line rolls it back, so it
   creates no job, and memory stays bounded by a chunk (and one row by
   ``RELAY_MAX_ROW_BYTES``) whatever the files' sizes. The jobs' ``batches`` rows go in
   last, after every file's rows are stored and checked. Then dispatchers are woken.
"""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
from collections.abc import Container, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import PurePosixPath
from typing import BinaryIO

import orjson
from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.multipart import BadContentDispositionHeader, BadContentDispositionParam

from relay_batches.errors import ApiError, invalid
from relay_batches.ids import new_id
from relay_batches.ledger.idempotency import IdempotencyClaim
from relay_batches.ledger.jobs import JobWriter
from relay_batches.model import Job
from relay_batches.services.ingest_api.create import Creation, create
from relay_batches.services.ingest_api.deps import ApiDeps
from relay_batches.services.ingest_api.edge.body import (
    BodyTicket,
    body_errors,
    check_body,
    too_large,
)
from relay_batches.services.ingest_api.edge.middleware import json_response
from relay_batches.services.ingest_api.rows.files import FileReader, LineError
from relay_batches.services.ingest_api.rows.job_fields import (
    JOB_FIELDS,
    MAX_NAME_CHARS,
    BatchOptions,
    parse_budget_field,
    parse_priority_field,
    validate_batch_options,
)
from relay_batches.services.ingest_api.rows.validation import (
    RowInput,
)
from relay_batches.services.ingest_api.submit import (
    job_fields,
    plan_job,
    row_models,
)

FILE_FIELD = "file"
ROW_MODEL = "row model"  # stands for the rows' own model while the other fields are checked
JSON_FIELDS = frozenset({"params", "metadata"})  # form fields holding a JSON-encoded value
MAX_FILES = 100
MAX_PARTS = MAX_FILES + 50
MAX_FIELD_BYTES = 8 * 1024  # a text field; a JSON field is bounded by the body limit only
MULTIPART = "multipart/form-data"
READ_CHUNK = 64 * 1024
SPOOL_STEP = 4 * 1024 * 1024  # bytes of a file part spooled (and hashed) per write
_BAD_DISPOSITION = (BadContentDispositionHeader, BadContentDispositionParam)


@dataclass(frozen=True)
class UploadedFile:
    """One ``file`` part: its base name, its bytes spooled to ``spool`` (``size`` of
    them) and their SHA-256 (hex)."""

    filename: str
    spool: BinaryIO
    size: int
    sha256: str


@dataclass(frozen=True)
class UploadForm:
    """The parts of an upload request that matter: the files and the option fields."""

    files: list[UploadedFile]
    fields: dict[str, str]


def add_upload_routes(app: web.Application) -> None:
    """Register ``POST /v1/batches/upload`` on ``app``."""
    app.router.add_post("/batches/upload", upload_batches)


async def upload_batches(request: web.Request) -> web.Response:
    """Create one job per uploaded file; ``201 {object: list, data: [batch, …]}``."""
    return await create(request, CREATE)


async def _read(
    request: web.Request, deps: ApiDeps, ticket: BodyTicket, spools: ExitStack
) -> UploadForm:
    return await read_upload_form(request, deps.max_body_bytes, ticket, spools, deps)


@dataclass(frozen=True)
class _Planned:
    """A form whose job-level fields are checked, with who asked and when."""

    form: UploadForm
    payload: dict[str, object]
    options: BatchOptions | None
    workspace_id: str
    now: datetime


def _plan(form: UploadForm, deps: ApiDeps, workspace_id: str, now: datetime) -> _Planned:
    payload, options = form_options(form, deps)
    return _Planned(form, payload, options, workspace_id, now)


async def _store(
    deps: ApiDeps, plan: _Planned, claim: IdempotencyClaim | None, large: bool
) -> list[Job]:
    """Every file's job, stored in one transaction with ``claim``'s response."""
    async with deps.jobs.streaming() as writer:
        batches = await store_upload(
            writer, plan.form, plan.payload, plan.options, deps, plan.workspace_id, plan.now, large
        )
        if claim is not None:
            await writer.record(claim, _listing(batches))
    return batches


def _answer(_: web.Request, batches: list[Job]) -> web.Response:
    return json_response(_listing(batches), status=201)


def _listing(batches: Sequence[Job]) -> dict[str, object]:
    return {"object": "list", "data": [b.to_api() for b in batches]}


def canonical_form(form: UploadForm) -> bytes:
    """What an upload asked for, independent of its multipart boundary (for idempotency);
    a blank field is absent, as :func:`form_payload` reads it."""
    files = [[f.filename, f.sha256] for f in form.files]
    fields = sorted((name, text) for name, text in form.fields.items() if text.strip())
    return orjson.dumps({"fields": fields, "files": files})


# --- 1. read --------------------------------------------------------------------------


async def read_upload_form(
    request: web.Request, max_bytes: int, ticket: BodyTicket, spools: ExitStack, deps: ApiDeps
) -> UploadForm:
    """Stream the multipart body, each file into a temporary file closed by ``spools``:
    415 for another type, 413 past ``max_bytes``, 408 when it stalls, 503 when it is
    large and every large-body slot is taken."""
    check_body(request, MULTIPART, max_bytes)
    ticket.grow(request.content_length or 0)
    try:
        with body_errors():
            return await _read_parts(request, max_bytes, ticket, _Spooler(spools, deps.spool_dir))
    except web.HTTPRequestEntityTooLarge:
        raise too_large(max_bytes) from None
    except (ValueError, RuntimeError, TypeError, HttpProcessingError, *_BAD_DISPOSITION) as exc:
        # aiohttp's errors for a malformed body or part headers (its warnings about a bad
        # Content-Disposition are raised only where warnings are errors, as in the tests)
        message = exc.message if isinstance(exc, HttpProcessingError) else str(exc)
        raise invalid(f"malformed multipart body: {_printable(message)}") from None


class _Spooler:
    """Makes the temporary files the parts are spooled to, each closed (so deleted) with
    ``spools``."""

    def __init__(self, spools: ExitStack, spool_dir: str | None) -> None:
        self._spools = spools
        self._dir = spool_dir

    def new(self) -> BinaryIO:
        """A new empty temporary file."""
        return self._spools.enter_context(tempfile.TemporaryFile(dir=self._dir))


async def _read_parts(
    request: web.Request, max_bytes: int, ticket: BodyTicket, spooler: _Spooler
) -> UploadForm:
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
            if len(files) == MAX_FILES:
                raise invalid(f"at most {MAX_FILES} files per upload", FILE_FIELD)
            filename = clean_filename(part.filename)
            upload = await _spool(
                part, filename, spooler.new(), budget, too_large(max_bytes), ticket
            )
            files.append(upload)
            budget -= upload.size
            continue
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


async def _spool(
    part: BodyPartReader,
    filename: str,
    spool: BinaryIO,
    limit: int,
    error: ApiError,
    ticket: BodyTicket,
) -> UploadedFile:
    """Copy a file part into ``spool``, hashing it; written (and hashed) a step at a time
    off the event loop."""
    loop = asyncio.get_running_loop()
    digest = hashlib.sha256()
    size = 0
    pending = bytearray()
    while chunk := await _chunk(part, ticket):
        size += len(chunk)
        if size > limit:
            raise error
        pending += chunk
        if len(pending) >= SPOOL_STEP:
            await loop.run_in_executor(None, _write, spool, digest, bytes(pending))
            pending = bytearray()
    await loop.run_in_executor(None, _write, spool, digest, bytes(pending))
    return UploadedFile(filename, spool, size, digest.hexdigest())


def _write(spool: BinaryIO, digest: hashlib._Hash, data: bytes) -> None:
    digest.update(data)
    spool.write(data)


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


# --- 2. validate, 3. store -----------------------------------------------------------


def form_options(form: UploadForm, deps: ApiDeps) -> tuple[dict[str, object], BatchOptions | None]:
    """The form's fields as a ``POST /v1/batches`` body, and its job-level fields validated
    (None without a ``model`` field: each job's model is then its file's first row's own
    ``model``, which an OpenAI or Anthropic line always names). Every field but the
    model is checked here either way, so a bad one is a 400 before any row is stored."""
    payload = form_payload(form.fields)
    if "model" in payload:
        options: BatchOptions | None = job_fields(payload, deps)
    else:
        options = None
        validate_batch_options({**payload, "model": ROW_MODEL}, {ROW_MODEL})
    if not form.files:
        raise invalid("at least one file (.csv or .jsonl) is required", FILE_FIELD)
    return payload, options


async def store_upload(
    writer: JobWriter,
    form: UploadForm,
    payload: dict[str, object],
    options: BatchOptions | None,
    deps: ApiDeps,
    workspace_id: str,
    now: datetime,
    large: bool,
) -> list[Job]:
    """Store one job per file, in order, on ``writer`` (the caller's transaction): every
    file's rows first, checked, then all the jobs' ``batches`` rows at the end, so no
    lock on ``batches`` is held while the files stream (see :class:`JobWriter`)."""
    known = row_models(deps)
    planned = []
    for index, upload in enumerate(form.files):
        batch_id = new_id()
        total, first = await _store_rows(
            writer, batch_id, index, upload, deps, known, large, payload
        )
        job = options if options is not None else _row_model_options(payload, first, deps)
        job = replace(job, endpoint=first.endpoint)  # the form's, else the file's url
        name = job_name(job.name, upload.filename, len(form.files))
        new = plan_job(job, [], workspace_id, now, name).new
        planned.append(replace(new, id=batch_id, total=total))
    return [await writer.insert(new) for new in planned]


async def _store_rows(
    writer: JobWriter,
    batch_id: str,
    index: int,
    upload: UploadedFile,
    deps: ApiDeps,
    known: Container[str],
    large: bool,
    payload: Mapping[str, object],
) -> tuple[int, RowInput]:
    """COPY the file's rows under ``batch_id`` a chunk at a time, each validated in the
    parser executor; how many, and the first. A 400 naming the file and line for the
    first bad line or repeated custom id."""
    loop = asyncio.get_running_loop()
    parser = deps.parser_for(large)
    await loop.run_in_executor(None, upload.spool.seek, 0)
    with _file_errors(index, upload):
        given = payload.get("endpoint")
        reader = await loop.run_in_executor(
            parser,
            FileReader,
            upload.filename,
            upload.spool,
            deps.limits,
            known,
            given if isinstance(given, str) else None,
        )
        first: RowInput | None = None
        while rows := await loop.run_in_executor(parser, reader.next_chunk):
            first = rows[0] if first is None else first
            await writer.add_rows(
                batch_id, reader.rows - len(rows), [(r.custom_id, r.request_json) for r in rows]
            )
        if first is None:
            raise LineError(None, "the file holds no rows")
        repeat = await writer.first_duplicate(batch_id)
        if repeat is not None:
            raise reader.duplicate(*repeat)
    return reader.rows, first


def _row_model_options(payload: dict[str, object], first: RowInput, deps: ApiDeps) -> BatchOptions:
    """The job-level fields with the file's first row's model as the job's."""
    if first.model is None:
        raise invalid(
            "model is required: give the model field, or a model in every row of the file"
            " (OpenAI and Anthropic lines always carry one)",
            "model",
        )
    return job_fields({**payload, "model": first.model}, deps)


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


@contextmanager
def _file_errors(index: int, upload: UploadedFile) -> Iterator[None]:
    """A :class:`LineError` of the ``index``-th file as a 400 naming it and the line."""
    try:
        yield
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


CREATE = Creation(_read, canonical_form, _plan, _store, list, _answer)
