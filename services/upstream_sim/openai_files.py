"""The simulator's OpenAI Files API objects: a stored file, the upload's form read in
bounded memory, a batch input file checked line by line as OpenAI checks it before
running it, and OpenAI's error object."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import orjson
from aiohttp import BodyPartReader, web

from relay_batches.services.upstream_sim import batches
from relay_batches.services.upstream_sim.echo import InvalidRequest, json_response
from relay_batches.services.upstream_sim.openai_endpoints import ENDPOINTS

MAX_FILE_BYTES = 200 * 1024 * 1024
MAX_LINES = 50_000
MAX_LISTED_ERRORS = 1000
ENDPOINT = "/v1/chat/completions"
FILE_TTL_S = 30 * 24 * 3600  # batch files expire after 30 days
MULTIPART_SLACK = 64 * 1024  # form fields and boundaries around the file
MAX_FORM_FIELDS = 8  # besides the file, each of at most a KiB


def openai_error(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> web.Response:
    """An OpenAI API error answer (``invalid_request_error`` below 500)."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    payload = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return json_response(payload, status=status)


@dataclass(eq=False)
class StoredFile:
    """An uploaded file (``data``) or a batch's output or error file (``render``)."""

    id: str
    filename: str
    purpose: str
    created_at: int
    size: int
    data: bytes = b""
    render: Callable[[], AsyncIterator[bytes]] | None = None

    def to_object(self) -> dict[str, object]:
        """The file object."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.size,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
            "expires_at": self.created_at + FILE_TTL_S,
        }

    async def chunks(self) -> AsyncIterator[bytes]:
        """The content, in pieces of about a MiB."""
        if self.render is not None:
            async for chunk in self.render():
                yield chunk
            return
        for start in range(0, len(self.data), batches.STREAM_BYTES):
            yield self.data[start : start + batches.STREAM_BYTES]


@dataclass
class InputCheck:
    """A batch input file read line by line: where each line lies, its custom_ids, the
    first model named and the errors that fail the batch."""

    spans: list[tuple[int, int]] = field(default_factory=list)
    custom_ids: set[str] = field(default_factory=set)
    errors: list[dict[str, object]] = field(default_factory=list)
    model: str | None = None

    def fail(self, code: str, message: str, line: int | None, param: str | None = None) -> None:
        """Record an error (the first :data:`MAX_LISTED_ERRORS` are listed)."""
        if len(self.errors) < MAX_LISTED_ERRORS:
            self.errors.append({"code": code, "message": message, "param": param, "line": line})


def _line_spans(data: bytes) -> list[tuple[int, int]]:
    spans, start = [], 0
    while start < len(data):
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        spans.append((start, end))
        start = end + 1
    return spans


async def check_input(data: bytes, endpoint: str = ENDPOINT) -> InputCheck:
    """Validate a batch input file of ``endpoint`` as OpenAI does before running it."""
    check = InputCheck(spans=_line_spans(data))
    if not check.spans:
        check.fail("empty_file", "The batch input file is empty.", None)
    if len(check.spans) > MAX_LINES:
        message = f"The batch input file has more than the maximum of {MAX_LINES} requests."
        check.fail("too_many_tasks", message, None)
    view = memoryview(data)
    for index, (start, end) in enumerate(check.spans):
        _check_line(check, view[start:end], index + 1, endpoint)
        await batches.pause_every(index)
    return check


def _check_line(check: InputCheck, raw: memoryview, line: int, endpoint: str) -> None:
    try:
        item = orjson.loads(raw)
    except orjson.JSONDecodeError:
        item = None
    if not isinstance(item, dict):
        check.fail("invalid_json_line", "This line is not parseable as valid JSON.", line)
        return
    custom_id, body = item.get("custom_id"), item.get("body")
    if not isinstance(custom_id, str) or not custom_id:
        message = "Missing required parameter: 'custom_id'."
        check.fail("missing_required_parameter", message, line, "custom_id")
    elif custom_id in check.custom_ids:
        message = (
            "The custom_id for this request is a duplicate of another request. The"
            " custom_id parameter must be unique for each request in a batch."
        )
        check.fail("duplicate_custom_id", message, line, "custom_id")
    else:
        check.custom_ids.add(custom_id)
    if item.get("method") != "POST":
        check.fail("invalid_method", "The method of every request must be POST.", line, "method")
    if item.get("url") != endpoint:
        message = "The URL provided for this request does not match the batch endpoint."
        check.fail("url_mismatch", message, line, "url")
    if not isinstance(body, dict):
        message = "Missing required parameter: 'body'."
        check.fail("missing_required_parameter", message, line, "body")
        return
    if check.model is None and isinstance(body.get("model"), str):
        check.model = body["model"]
    try:
        chat = ENDPOINTS[endpoint][0](body)
    except InvalidRequest:
        return  # the request itself answers 400 in the error file
    if batches.BATCH_FAIL_MARKER in chat.last_user:
        message = "simulated failure of the whole batch ([sim:batch-fail])"
        check.fail("batch_failed", message, line)


async def read_upload(request: web.Request) -> tuple[str, bytes] | web.Response:
    """The file name and bytes of a ``POST /v1/files`` (a multipart ``purpose``, which
    must be ``batch``, and ``file``), or the error answering it."""
    if (request.content_length or 0) > MAX_FILE_BYTES + MULTIPART_SLACK:
        return _too_large()
    if not request.content_type.startswith("multipart/"):
        return openai_error(400, "The request must be multipart/form-data.")
    fields: dict[str, str] = {}
    upload: tuple[str, bytes] | None = None
    async for part in await request.multipart():
        if not isinstance(part, BodyPartReader) or len(fields) > MAX_FORM_FIELDS:
            return openai_error(400, "The form holds more fields than 'purpose' and 'file'.")
        if part.name == "file":
            data = await _read_part(part, MAX_FILE_BYTES)
            if data is None:
                return _too_large()
            upload = (part.filename or "upload.jsonl", data)
        elif part.name:
            text = await _read_part(part, 1024)
            fields[part.name] = (text or b"").decode(errors="replace")
    if fields.get("purpose") != "batch":
        return openai_error(400, "'purpose' must be 'batch'.", "purpose")
    if upload is None:
        return openai_error(400, "Missing required parameter: 'file'.", "file")
    return upload


async def _read_part(part: BodyPartReader, cap: int) -> bytes | None:
    buffer = bytearray()
    while chunk := await part.read_chunk(batches.READ_CHUNK):
        buffer += chunk
        if len(buffer) > cap:
            return None
    return bytes(buffer)


def _too_large() -> web.Response:
    message = f"The file is larger than the maximum of {MAX_FILE_BYTES} bytes."
    return openai_error(413, message, "file")


def random_hex(size: int) -> str:
    """``size`` random bytes in hex (a new file or batch id)."""
    return os.urandom(size).hex()
