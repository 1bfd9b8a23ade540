"""``/openai/v1/files``: upload, list, retrieve, read and delete files, as OpenAI does.

An upload (multipart, ``purpose=batch``, up to :data:`MAX_FILE_BYTES` or
``RELAY_MAX_BODY_BYTES`` if lower: :func:`file_limit`) is first
received whole, its file part spooled to an anonymous temporary file (in
``ApiDeps.spool_dir``, else the system's temporary directory; gone when the request
ends, however it ends), so a slow or stalled client holds no ledger connection. Then
it is stored in one transaction (at 1,000,000 lines it lasts seconds to tens of
seconds; what it blocks and what not: :mod:`relay_batches.ledger.files`): its bytes as
stored parts (so ``content`` returns the file as uploaded) and each line parsed into a
request row under the file's id (:mod:`..rows.openai_file`), :data:`STEP_BYTES` at a time,
parsed off the event loop; at most ``MAX_LONG_STORES`` long stores (these and native
uploads together) hold a connection at once. Memory stays bounded by a
step, whatever the file's size. The body policy is the native upload's (:mod:`.body`:
large-body slots, so at most that many large uploads spool at once, stall and rate
timeouts, 413, 415).

A file is ``file-<32 hex>``; an id that does not parse, or belongs to another
workspace, is a 404. A batch's output and error files (``purpose: batch_output``) are
files too, rendered from its outcomes (:mod:`.output`).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import BinaryIO, TypeVar

import orjson
from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.multipart import BadContentDispositionHeader, BadContentDispositionParam

from relay_batches.dialects.openai.shapes import (
    OpenAIFile,
    OpenAIFileDeleted,
    OpenAIFileList,
)
from relay_batches.errors import ApiError, invalid
from relay_batches.ids import is_valid_id, new_id
from relay_batches.ledger.files import INPUT_PURPOSE, OUTPUT_PURPOSE, StoredFile
from relay_batches.services.ingest_api.deps import DEPS, ApiDeps
from relay_batches.services.ingest_api.edge.body import (
    RETRY_AFTER_S,
    BodyTicket,
    body_errors,
    check_body,
    too_large,
)
from relay_batches.services.ingest_api.edge.middleware import STREAMING, WORKSPACE_ID, json_response
from relay_batches.services.ingest_api.edge.paging import page_limit
from relay_batches.services.ingest_api.rows.openai_file import LineReader
from relay_batches.services.ingest_api.rows.validation import (
    KnownModels,
)
from relay_batches.services.ingest_api.surfaces.native.upload import clean_filename
from relay_batches.services.ingest_api.surfaces.openai.output import (
    filename_of,
    kind_of,
    output_file,
    rendered,
)

FILE_PREFIX = "file-"
MAX_FILE_BYTES = 256 * 1024 * 1024  # OpenAI takes 200 MB; 1,000,000 lines of ~250 bytes fit
FORM_SLACK = 64 * 1024  # multipart framing and the purpose field around the file
STEP_BYTES = 4 * 1024 * 1024  # bytes spooled per write, and stored and parsed per step
READ_CHUNK = 256 * 1024
MAX_FIELD_BYTES = 1024
MAX_FILENAME_CHARS = 256
MAX_PARTS = 8
MAX_DOWNLOADS_PER_WORKSPACE = 4
DEFAULT_FILE_PAGE = 10_000
MAX_FILE_PAGE = 10_000
MULTIPART = "multipart/form-data"
_BAD_DISPOSITION = (BadContentDispositionHeader, BadContentDispositionParam)
T = TypeVar("T")


def file_hex(file_id: str) -> str | None:
    """The 32-hex id inside ``file-<hex>``, None if it is not one."""
    hex_id = file_id.removeprefix(FILE_PREFIX)
    return hex_id if file_id.startswith(FILE_PREFIX) and is_valid_id(hex_id) else None


def file_object(stored: StoredFile) -> OpenAIFile:
    """A stored file as OpenAI shapes it."""
    return OpenAIFile(
        id=FILE_PREFIX + stored.id,
        bytes=stored.bytes,
        created_at=int(stored.created_at.timestamp()),
        filename=stored.filename,
        purpose="batch" if stored.purpose == INPUT_PURPOSE else "batch_output",
    )


def _not_found(file_id: str) -> ApiError:
    return ApiError(404, f"No such File object: {file_id[:80]!r}", "file_id")


# --- upload -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Form:
    """A received upload form: the file part is spooled, ``size`` bytes."""

    filename: str
    size: int


async def create_file(request: web.Request) -> web.Response:
    """``POST /files``: receive the form (the file spooled to a temporary file), then
    store the file and its rows; 200 with the file object."""
    deps = request.app[DEPS]
    workspace_id = request[WORKSPACE_ID]
    async with deps.body_gate.admit(workspace_id) as ticket:
        limit = file_limit(deps)
        _check_upload(request, limit)
        ticket.grow(request.content_length or 0)
        with tempfile.TemporaryFile(dir=deps.spool_dir) as spool:
            form = await _receive_form(request, spool, _Receiving(ticket, limit))
            stored = await _store_spooled(spool, form, deps, workspace_id, ticket.large)
    return json_response(file_object(stored).model_dump())


def file_limit(deps: ApiDeps) -> int:
    """The largest file an upload may send: :data:`MAX_FILE_BYTES`, or
    ``RELAY_MAX_BODY_BYTES`` when that is lower."""
    return min(MAX_FILE_BYTES, deps.max_body_bytes)


@dataclass(frozen=True)
class _Receiving:
    """A form being received: its body's ticket and the file limit."""

    ticket: BodyTicket
    limit: int


def _check_upload(request: web.Request, limit: int) -> None:
    """The body checks of :func:`.body.check_body`; a 413 names the file limit."""
    try:
        check_body(request, MULTIPART, limit + FORM_SLACK)
    except ApiError as exc:
        if exc.status == 413:
            raise too_large(limit) from None
        raise


async def _read(step: Awaitable[T], receiving: _Receiving) -> T:
    """One read of the multipart body; what a broken body raises is a 400."""
    try:
        with body_errors():
            return await receiving.ticket.within(step)
    except web.HTTPRequestEntityTooLarge:
        raise too_large(receiving.limit) from None
    except (ValueError, RuntimeError, TypeError, HttpProcessingError, *_BAD_DISPOSITION) as exc:
        message = exc.message if isinstance(exc, HttpProcessingError) else str(exc)
        raise invalid(f"malformed multipart body: {_printable(message)}") from None


async def _receive_form(request: web.Request, spool: BinaryIO, receiving: _Receiving) -> _Form:
    """Read the whole form, the file part into ``spool``; no ledger connection is held
    while the client sends."""
    reader = await _read(request.multipart(), receiving)
    purpose: str | None = None
    form: _Form | None = None
    for _ in range(MAX_PARTS):
        part = await _read(reader.next(), receiving)
        if part is None:
            break
        if not isinstance(part, BodyPartReader):
            raise invalid("nested multipart bodies are not supported")
        if part.name == "purpose":
            purpose = _purpose(await _read_field(part, receiving))
        elif part.name == "file" and form is None:
            filename = clean_filename(part.filename or "")[:MAX_FILENAME_CHARS]
            if not filename:
                raise invalid("file must be sent as a file part with a filename", "file")
            form = _Form(filename, await _spool_file(part, spool, receiving))
        elif part.name == "file":
            raise invalid("send one file per upload", "file")
        elif (part.name or "").startswith("expires_after"):
            raise invalid(
                "expires_after is not supported: files are kept until deleted", "expires_after"
            )
        else:
            name = _printable(part.name or "", 64)
            raise invalid(f"{name!r} is not a field of a file upload (file, purpose)", name or None)
    else:
        raise invalid(f"at most {MAX_PARTS} parts per upload")
    if purpose is None:
        raise invalid("purpose is required", "purpose")
    if form is None:
        raise invalid("file is required", "file")
    return form


def _purpose(text: str) -> str:
    if text.strip() != INPUT_PURPOSE:
        raise invalid("purpose must be batch (the only purpose this API stores)", "purpose")
    return INPUT_PURPOSE


async def _chunk(part: BodyPartReader, receiving: _Receiving) -> bytes:
    chunk = await _read(part.read_chunk(READ_CHUNK), receiving)
    receiving.ticket.count(len(chunk))
    return chunk


async def _read_field(part: BodyPartReader, receiving: _Receiving) -> str:
    data = bytearray()
    while chunk := await _chunk(part, receiving):
        data += chunk
        if len(data) > MAX_FIELD_BYTES:
            raise invalid(f"{part.name} is too long", part.name)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise invalid(f"{part.name} must be UTF-8 text", part.name) from None


async def _spool_file(part: BodyPartReader, spool: BinaryIO, receiving: _Receiving) -> int:
    """Copy the file part into ``spool`` (written a step at a time off the event loop);
    its size, a 413 past the file limit (:func:`file_limit`)."""
    loop = asyncio.get_running_loop()
    size = 0
    pending = bytearray()
    while chunk := await _chunk(part, receiving):
        size += len(chunk)
        if size > receiving.limit:
            raise too_large(receiving.limit)
        pending += chunk
        if len(pending) >= STEP_BYTES:
            await loop.run_in_executor(None, spool.write, bytes(pending))
            pending = bytearray()
    await loop.run_in_executor(None, spool.write, bytes(pending))
    return size


async def _store_spooled(
    spool: BinaryIO, form: _Form, deps: ApiDeps, workspace_id: str, large: bool
) -> StoredFile:
    """Store the spooled file in one transaction: its bytes and its rows, parsed a step
    at a time in the parser executor."""
    reader = LineReader(deps.limits, KnownModels(deps.model_known))
    loop = asyncio.get_running_loop()
    parser = deps.parser_for(large)
    await loop.run_in_executor(None, spool.seek, 0)
    async with deps.files.upload(new_id()) as upload:
        while data := await loop.run_in_executor(None, spool.read, STEP_BYTES):
            await upload.add_bytes(data)
            await upload.add_rows(await loop.run_in_executor(parser, reader.feed, data))
        await upload.add_rows(await loop.run_in_executor(parser, reader.feed, b"", True))
        reader.finish()
        if not reader.errors:
            for custom_id, row_index in await upload.duplicate_ids(10):
                reader.duplicate(custom_id, row_index)
        if reader.errors:
            await upload.drop_rows()
        errors = None
        if reader.errors:
            errors = orjson.dumps([e.to_api() for e in reader.errors]).decode()
        rows_kept = 0 if reader.errors else reader.rows
        return await upload.finish(
            workspace_id,
            form.filename,
            form.size,
            rows_kept,
            reader.model,
            errors,
            reader.endpoint,
        )


def _printable(text: str, limit: int = 200) -> str:
    return "".join(ch for ch in text[:limit] if ch.isprintable())


# --- read -------------------------------------------------------------------------


def _path_file_id(request: web.Request) -> tuple[str, str]:
    """The path's ``file_id`` as given and the hex id the ledger keeps it under; not found
    when it is no file id of ours."""
    raw = request.match_info["file_id"]
    hex_id = file_hex(raw)
    if hex_id is None:
        raise _not_found(raw)
    return raw, hex_id


async def _find(request: web.Request) -> StoredFile:
    """The live file of the path's ``file_id`` in the caller's workspace; an output or
    error file is registered here the first time it is asked for."""
    deps = request.app[DEPS]
    workspace_id = request[WORKSPACE_ID]
    raw, hex_id = _path_file_id(request)
    stored = await deps.files.get(workspace_id, hex_id)
    if stored is None:
        linked = await deps.files.batch_of_output(workspace_id, hex_id)
        kind = None if linked is None else kind_of(linked, hex_id)
        if linked is not None and kind is not None:
            stored = await output_file(deps, linked, kind)
    if stored is None:
        raise _not_found(raw)
    return stored


async def get_file(request: web.Request) -> web.Response:
    """``GET /files/{file_id}``."""
    return json_response(file_object(await _find(request)).model_dump())


async def list_files(request: web.Request) -> web.Response:
    """``GET /files``: ``limit`` (1–10,000, default 10,000), ``after``, ``order``
    (``desc`` by default), ``purpose``."""
    query = request.query
    limit = page_limit(query.get("limit"), DEFAULT_FILE_PAGE, MAX_FILE_PAGE)
    after = query.get("after")
    after_hex = None if after is None else file_hex(after)
    if after is not None and after_hex is None:
        raise invalid("after must be a file id", "after")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid("order must be asc or desc", "order")
    purpose = query.get("purpose")
    if purpose is not None and purpose not in (INPUT_PURPOSE, OUTPUT_PURPOSE):
        raise invalid("purpose must be batch or batch_output", "purpose")
    deps = request.app[DEPS]
    page, more = await deps.files.list_page(
        request[WORKSPACE_ID], limit, after_hex, order == "asc", purpose
    )
    data = [file_object(f) for f in page]
    listing = OpenAIFileList(
        data=data,
        has_more=more,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
    )
    return json_response(listing.model_dump())


class DownloadGate:
    """How many ``content`` streams a workspace may hold open at once (each holds a part
    or a rendered page while its client drains it). Single event loop: no lock."""

    def __init__(self, per_workspace: int = MAX_DOWNLOADS_PER_WORKSPACE) -> None:
        self.per_workspace = per_workspace
        self.open: dict[str, int] = {}

    @contextmanager
    def hold(self, workspace_id: str) -> Iterator[None]:
        """One stream of ``workspace_id``; a 503 while it holds ``per_workspace``."""
        held = self.open.get(workspace_id, 0)
        if held >= self.per_workspace:
            raise ApiError(
                503,
                f"this workspace already reads {held} files at once, retry in {RETRY_AFTER_S} s",
            )
        self.open[workspace_id] = held + 1
        try:
            yield
        finally:
            if self.open[workspace_id] == 1:
                del self.open[workspace_id]
            else:
                self.open[workspace_id] -= 1


DOWNLOADS = web.AppKey("openai_downloads", DownloadGate)


async def get_file_content(request: web.Request) -> web.StreamResponse:
    """``GET /files/{file_id}/content``: the bytes as uploaded, or the rendered lines of
    an output or error file, streamed with their ``Content-Length``; at most
    :data:`MAX_DOWNLOADS_PER_WORKSPACE` at once per workspace."""
    with request.app[DOWNLOADS].hold(request[WORKSPACE_ID]):
        return await _stream_content(request)


async def _stream_content(request: web.Request) -> web.StreamResponse:
    stored = await _find(request)
    deps = request.app[DEPS]
    chunks: AsyncIterator[bytes]
    if stored.purpose == INPUT_PURPOSE:
        chunks = deps.files.parts(stored.id)
    else:
        linked = await deps.files.batch_of_output(stored.workspace_id, stored.id)
        kind = None if linked is None else kind_of(linked, stored.id)
        if linked is None or kind is None:
            raise _not_found(request.match_info["file_id"])
        chunks = rendered(deps, linked.job, kind)
    # The first chunk is read before the headers go: content gone already (the file
    # or its batch deleted since it was found) is a 404, as if the delete came first.
    parts = aiter(chunks)
    first = await anext(parts, None)
    if first is None and stored.bytes > 0:
        raise _not_found(request.match_info["file_id"])
    response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    response.content_length = stored.bytes
    await response.prepare(request)
    request[STREAMING] = True  # from here on a failure can only abort the connection
    sent = 0
    pending = [] if first is None else [first]
    async for chunk in _chained(pending, parts):
        sent += len(chunk)
        if sent > stored.bytes:
            break
        await response.write(chunk)
    if sent != stored.bytes:
        # Deleted while it streamed (the file, or its batch): the rows ran out, or came
        # out other than measured. Abort the transfer rather than end it short of its
        # Content-Length, on which the client would wait for bytes that never come.
        raise ContentChanged(f"{stored.id}: {sent} bytes of {stored.bytes}")
    await response.write_eof()
    return response


async def _chained(head: list[bytes], rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``head``'s chunks, then the rest of the iterator."""
    for chunk in head:
        yield chunk
    async for chunk in rest:
        yield chunk


class ContentChanged(RuntimeError):
    """A file's content stopped matching the length its download declared."""


async def delete_file(request: web.Request) -> web.Response:
    """``DELETE /files/{file_id}``: gone for good (a batch already created from an
    input file keeps running its rows)."""
    deps = request.app[DEPS]
    workspace_id = request[WORKSPACE_ID]
    raw, hex_id = _path_file_id(request)
    if not await deps.files.delete(workspace_id, hex_id):
        linked = await deps.files.batch_of_output(workspace_id, hex_id)
        kind = None if linked is None else kind_of(linked, hex_id)
        if linked is None or kind is None or await deps.files.file_known(workspace_id, hex_id):
            raise _not_found(raw)
        created: datetime = linked.job.completed_at or linked.job.created_at
        name = filename_of(linked, kind)
        await deps.files.delete_output_file(workspace_id, hex_id, name, created)
    return json_response(OpenAIFileDeleted(id=raw, deleted=True).model_dump())


def add_file_routes(app: web.Application) -> None:
    """Register the ``/openai/v1/files`` routes on ``app``."""
    app[DOWNLOADS] = DownloadGate()
    app.router.add_post("/files", create_file)
    app.router.add_get("/files", list_files)
    app.router.add_get("/files/{file_id}", get_file)
    app.router.add_delete("/files/{file_id}", delete_file)
    app.router.add_get("/files/{file_id}/content", get_file_content)
