"""The simulator's OpenAI Files and Batches APIs: ``/v1/files`` and ``/v1/batches``.

An input file is validated when its batch is created (in chunks, yielding to the event
loop) and the verdict shows at the first poll: ``failed`` with ``errors``, or
``in_progress``; the first poll at least ``SimConfig.batch_delay_s`` after creation runs
every line as the realtime endpoint of the batch (``/v1/chat/completions``,
``/v1/embeddings``, ``/v1/completions``, ``/v1/moderations`` or ``/v1/responses``) would
answer it and ends the batch.
The output and error files are views rendered again at each download (ids derived from
the batch and the line), so a batch holds its input and a status per line, never its
outputs: memory is bounded by the input caps whatever ``[sim:reply-bytes=N]`` asks.
"""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from relay_batches.services.upstream_sim import batches
from relay_batches.services.upstream_sim.echo import InvalidRequest, json_response
from relay_batches.services.upstream_sim.openai_chat import error_payload
from relay_batches.services.upstream_sim.openai_endpoints import ENDPOINTS, usage_tokens
from relay_batches.services.upstream_sim.openai_files import (
    ENDPOINT,
    InputCheck,
    StoredFile,
    check_input,
    openai_error,
    random_hex,
    read_upload,
)

WINDOW = "24h"
ACTIVE = ("validating", "in_progress", "finalizing")


@dataclass(eq=False)
class Batch:
    """One batch: its input, its state and, once run, a status per line."""

    id: str
    input_file_id: str
    metadata: dict[str, str] | None
    created: float
    data: bytes
    check: InputCheck
    status: str = "validating"
    times: dict[str, int] = field(default_factory=dict)
    statuses: array[int] = field(default_factory=lambda: array("H"))
    output_file_id: str | None = None
    error_file_id: str | None = None
    endpoint: str = ENDPOINT
    completed: int = 0
    failed: int = 0
    out_bytes: int = 0
    err_bytes: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def to_object(self) -> dict[str, object]:
        """The batch object."""
        created_at = int(self.created)
        failed = self.status == "failed"
        total = 0 if failed or self.status == "validating" else len(self.check.spans)
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "model": self.check.model if self.status != "validating" else None,
            "errors": {"object": "list", "data": self.check.errors} if failed else None,
            "input_file_id": self.input_file_id,
            "completion_window": WINDOW,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": created_at,
            "in_progress_at": self.times.get("in_progress_at"),
            "expires_at": created_at + batches.WINDOW_S,
            "finalizing_at": self.times.get("finalizing_at"),
            "completed_at": self.times.get("completed_at"),
            "failed_at": self.times.get("failed_at"),
            "expired_at": self.times.get("expired_at"),
            "cancelling_at": self.times.get("cancelling_at"),
            "cancelled_at": self.times.get("cancelled_at"),
            "request_counts": {"total": total, "completed": self.completed, "failed": self.failed},
            "usage": self._usage(),
            "metadata": self.metadata,
        }

    def _usage(self) -> dict[str, object]:
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.input_tokens + self.output_tokens,
        }

    def record(self, index: int) -> tuple[bool, dict[str, object]]:
        """Line ``index``'s record and whether it belongs in the output file (else the
        error file), rendered from its input and its status."""
        start, end = self.check.spans[index]
        item = orjson.loads(memoryview(self.data)[start:end])
        status = self.statuses[index]
        record: dict[str, object] = {
            "id": "batch_req_" + batches.derived_hex(12, self.id, index),
            "custom_id": item["custom_id"],
            "response": None,
            "error": None,
        }
        if status == batches.EXPIRED:
            message = "This request could not be executed before the completion window expired."
            record["error"] = {"code": "batch_expired", "message": message}
            return False, record
        record["response"] = {
            "status_code": status,
            "request_id": batches.derived_hex(16, self.id, index, "request"),
            "body": self._body(item["body"], status, index),
        }
        return status == 200, record

    def _body(self, body: dict[str, Any], status: int, index: int) -> dict[str, object]:
        """What the realtime endpoint answers ``body`` with for ``status``."""
        read, answer = ENDPOINTS[self.endpoint]
        try:
            chat = read(body)
        except InvalidRequest as exc:
            return error_payload(str(exc), "invalid_request_error")
        if batches.is_batch_error(chat):
            return error_payload(batches.BATCH_ERROR_MESSAGE, "server_error")
        if status != 200:
            return error_payload(f"simulated status {status}", "sim_error")
        completion = answer(chat, chat.triggers().reply_bytes)
        # Stable ids and times: a batch's output reads the same at every download.
        stable = batches.derived_hex(12, self.id, index, "completion")
        if isinstance(completion.get("id"), str):  # <prefix><24 hex>: the hex made stable
            completion["id"] = completion["id"][:-24] + stable
        for key in ("created", "created_at"):
            if key in completion:
                completion[key] = self.times["in_progress_at"]
        return completion

    def render(self, output: bool, halfway: batches.Halfway) -> AsyncIterator[bytes]:
        """The output (or error) file's content, last input line first, ``halfway``
        awaited once half of the lines are out."""

        def line(index: int) -> bytes | None:
            is_output, record = self.record(index)
            return orjson.dumps(record) + b"\n" if is_output == output else None

        return batches.jsonl_chunks(len(self.statuses), line, halfway)


class OpenAIBatches(batches.BatchApi):
    """The Files and Batches routes and their in-memory state."""

    _files: dict[str, StoredFile]
    _batches: dict[str, Batch]

    def reset(self) -> None:
        """Forget every file and batch."""
        self._files = {}
        self._batches = {}

    def add_routes(self, router: web.UrlDispatcher) -> None:
        """Register the endpoints."""
        router.add_post("/v1/files", self.upload)
        router.add_get("/v1/files/{file_id}", self.retrieve_file)
        router.add_get("/v1/files/{file_id}/content", self.file_content)
        router.add_delete("/v1/files/{file_id}", self.delete_file)
        router.add_post("/v1/batches", self.create)
        router.add_get("/v1/batches", self.list_batches)
        router.add_get("/v1/batches/{batch_id}", self.retrieve)
        router.add_post("/v1/batches/{batch_id}/cancel", self.cancel)

    # --- files -----------------------------------------------------------------------

    async def upload(self, request: web.Request) -> web.Response:
        """``POST /v1/files``: a multipart ``purpose`` (``batch``) and ``file``."""
        upload = await read_upload(request)
        if isinstance(upload, web.Response):
            return upload
        await self.hold_input()
        stored = StoredFile(
            id="file-" + random_hex(12),
            filename=upload[0],
            purpose="batch",
            created_at=int(self._clock()),
            size=len(upload[1]),
            data=upload[1],
        )
        self._files[stored.id] = stored
        return json_response(stored.to_object())

    def _file(self, request: web.Request) -> StoredFile | web.Response:
        file_id = request.match_info["file_id"]
        stored = self._files.get(file_id)
        if stored is None:
            return openai_error(404, f"No such File object: {file_id}", "id")
        return stored

    async def retrieve_file(self, request: web.Request) -> web.Response:
        """``GET /v1/files/{file_id}``: the file object."""
        stored = self._file(request)
        return stored if isinstance(stored, web.Response) else json_response(stored.to_object())

    async def file_content(self, request: web.Request) -> web.StreamResponse:
        """``GET /v1/files/{file_id}/content``: the bytes, streamed."""
        stored = self._file(request)
        if isinstance(stored, web.Response):
            return stored
        return await batches.stream(
            request, stored.chunks(), "application/octet-stream", stored.size
        )

    async def delete_file(self, request: web.Request) -> web.Response:
        """``DELETE /v1/files/{file_id}``: forget the file (a batch keeps its input)."""
        stored = self._file(request)
        if isinstance(stored, web.Response):
            return stored
        del self._files[stored.id]
        return json_response({"id": stored.id, "object": "file", "deleted": True})

    # --- batches ---------------------------------------------------------------------

    async def create(self, request: web.Request) -> web.Response:
        """``POST /v1/batches``: check the request, validate the input file, count it."""
        try:
            data = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return openai_error(400, "The request body is not valid JSON.")
        problem = _create_problem(data)
        if problem is not None:
            return openai_error(400, problem[1], problem[0])
        source = self._files.get(data["input_file_id"])
        if source is None:
            message = f"No such File object: {data['input_file_id']}"
            return openai_error(404, message, "input_file_id")
        if source.purpose != "batch":
            return openai_error(400, "The input file must have purpose 'batch'.", "input_file_id")
        check = await check_input(source.data, data["endpoint"])
        batch = Batch(
            id="batch_" + random_hex(12),
            input_file_id=source.id,
            metadata=data.get("metadata"),
            created=self._clock(),
            data=source.data,
            check=check,
            endpoint=data["endpoint"],
        )
        self._batches[batch.id] = batch
        self._state.count_batch(len(check.spans), check.custom_ids)
        return json_response(batch.to_object())

    def _batch(self, request: web.Request) -> Batch | web.Response:
        batch_id = request.match_info["batch_id"]
        batch = self._batches.get(batch_id)
        if batch is None:
            return openai_error(404, f"No batch found with id '{batch_id}'.", "batch_id")
        return batch

    async def retrieve(self, request: web.Request) -> web.Response:
        """``GET /v1/batches/{batch_id}``: the batch, moved on as far as time allows."""
        batch = self._batch(request)
        if isinstance(batch, web.Response):
            return batch
        await self._advance(batch)
        return json_response(batch.to_object())

    async def cancel(self, request: web.Request) -> web.Response:
        """``POST /v1/batches/{batch_id}/cancel``: ``cancelling`` now, ``cancelled`` at
        the next poll (no line runs after a cancel)."""
        batch = self._batch(request)
        if isinstance(batch, web.Response):
            return batch
        async with batch.lock:
            if batch.status in ACTIVE:
                batch.status = "cancelling"
                batch.times["cancelling_at"] = int(self._clock())
            elif batch.status != "cancelling":
                message = f"Cannot cancel a batch with status '{batch.status}'."
                return openai_error(409, message)
        return json_response(batch.to_object())

    async def list_batches(self, request: web.Request) -> web.Response:
        """``GET /v1/batches?limit=&after=``: newest first."""
        limit = batches.query_limit(request.query.get("limit"), 20, 100)
        if limit is None:
            return openai_error(400, "'limit' must be an integer from 1 to 100.", "limit")
        ids = list(reversed(self._batches))
        page, has_more = batches.cursor_page(ids, limit, request.query.get("after"))
        data = []
        for batch_id in page:
            await self._advance(self._batches[batch_id])
            data.append(self._batches[batch_id].to_object())
        return json_response(
            {
                "object": "list",
                "data": data,
                "first_id": page[0] if page else None,
                "last_id": page[-1] if page else None,
                "has_more": has_more,
            }
        )

    async def _advance(self, batch: Batch) -> None:
        async with batch.lock:
            now = self._clock()
            if batch.status == "validating":
                if batch.check.errors:
                    batch.status = "failed"
                    batch.times["failed_at"] = int(now)
                    return
                batch.status = "in_progress"
                batch.times["in_progress_at"] = int(now)
            if batch.status == "cancelling":
                batch.status = "cancelled"
                batch.times["cancelled_at"] = int(now)
                self._publish(batch, int(now))  # the lines answered before, if any
            elif (
                batch.status == "in_progress"
                and not self._config.batch_stall
                and now >= batch.created + self._delay
            ):
                await self._run(batch)
                self._finish(batch, int(self._clock()))

    @property
    def _delay(self) -> float:
        return self._config.batch_delay_s

    async def _run(self, batch: Batch) -> None:
        """Answer the lines not answered yet, in chunks; a poll cancelled between chunks
        leaves the batch consistent and the next poll goes on from there."""
        view = memoryview(batch.data)
        for index in range(len(batch.statuses), len(batch.check.spans)):
            start, end = batch.check.spans[index]
            body = orjson.loads(view[start:end])["body"]
            try:
                chat = ENDPOINTS[batch.endpoint][0](body)
            except InvalidRequest as exc:
                status = exc.status
            else:
                status = batches.batch_status(chat, self._state, self._config.error_rate)
                if status == 200:
                    self._state.answers.answer(chat)
            batch.statuses.append(status)
            _tally(batch, index)
            await batches.pause_every(index)

    def _finish(self, batch: Batch, now: int) -> None:
        batch.times["finalizing_at"] = now
        expired = batches.EXPIRED in batch.statuses
        batch.status = "expired" if expired else "completed"
        batch.times["expired_at" if expired else "completed_at"] = now
        self._publish(batch, now)

    def _publish(self, batch: Batch, now: int) -> None:
        """Create the output and error files of the lines answered (each if not empty)."""
        if batch.out_bytes:
            batch.output_file_id = self._view(batch, True, now)
        if batch.err_bytes:
            batch.error_file_id = self._view(batch, False, now)

    def _view(self, batch: Batch, output: bool, now: int) -> str:
        suffix = "output" if output else "error"
        stored = StoredFile(
            id="file-" + random_hex(12),
            filename=f"{batch.id}_{suffix}.jsonl",
            purpose="batch_output",
            created_at=now,
            size=batch.out_bytes if output else batch.err_bytes,
            render=lambda: batch.render(output, self.halfway),
        )
        self._files[stored.id] = stored
        return stored.id


def _tally(batch: Batch, index: int) -> None:
    """Count line ``index``'s answer and the bytes its record adds to its file."""
    is_output, record = batch.record(index)
    size = len(orjson.dumps(record)) + 1
    if is_output:
        batch.completed += 1
        batch.out_bytes += size
        given, written = usage_tokens(record["response"]["body"])  # type: ignore[index]
        batch.input_tokens += given
        batch.output_tokens += written
    else:
        batch.failed += 1
        batch.err_bytes += size


def _create_problem(data: Any) -> tuple[str | None, str] | None:
    """What is wrong with a create-batch body: (param, message), or ``None``."""
    if not isinstance(data, dict):
        return None, "The request body must be a JSON object."
    if not isinstance(data.get("input_file_id"), str):
        return "input_file_id", "Missing required parameter: 'input_file_id'."
    if data.get("endpoint") not in ENDPOINTS:
        served = ", ".join(ENDPOINTS)
        return "endpoint", f"Invalid value for 'endpoint': the simulator runs {served}."
    if data.get("completion_window") != WINDOW:
        return "completion_window", "Invalid value for 'completion_window': only '24h'."
    metadata = data.get("metadata")
    if metadata is not None and not _valid_metadata(metadata):
        message = "'metadata' must hold at most 16 string keys (64 chars) and values (512)."
        return "metadata", message
    return None


def _valid_metadata(metadata: Any) -> bool:
    return (
        isinstance(metadata, Mapping)
        and len(metadata) <= 16
        and all(
            isinstance(key, str) and len(key) <= 64 and isinstance(value, str) and len(value) <= 512
            for key, value in metadata.items()
        )
    )
