"""The simulator's Anthropic Message Batches API: ``/v1/messages/batches``.

Every endpoint wants the ``x-api-key`` and ``anthropic-version`` headers the realtime
``/v1/messages`` wants. A batch is ``in_progress`` until the first poll at least
``SimConfig.batch_delay_s`` after its creation, which runs every request as the realtime
endpoint would answer its ``params`` and ends the batch; a cancel makes it ``canceling``
and the next poll ends it with every request ``canceled``. The results are rendered again
at each download (message ids derived from the batch and the request), so a batch holds
each request's params and a status, never its replies.
"""

from __future__ import annotations

import asyncio
import os
import re
from array import array
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from relay_batches.services.upstream_sim import batches
from relay_batches.services.upstream_sim.anthropic_messages import (
    anthropic_error_payload,
    anthropic_error_response,
    check_messages_headers,
    message_payload,
    messages_request_from,
)
from relay_batches.services.upstream_sim.echo import InvalidRequest, json_response

MAX_REQUESTS = 100_000
MAX_BODY_BYTES = 256 * 1024 * 1024
CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
CANCELED = 1  # the status slot of a request canceled before it ran


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a batch: its custom_id and its params, encoded."""

    custom_id: str
    params: bytes


@dataclass(eq=False)
class MessageBatch:
    """One message batch: its requests, its state and, once ended, a status each."""

    id: str
    requests: list[Request]
    created: float
    canceling: bool = False
    cancel_initiated_at: float | None = None
    ended_at: float | None = None
    results_url: str | None = None
    statuses: array[int] = field(default_factory=lambda: array("H"))
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def ended(self) -> bool:
        """Whether processing ended (results are available)."""
        return self.ended_at is not None

    def to_object(self) -> dict[str, object]:
        """The message batch object."""
        if self.ended:
            status = "ended"
        else:
            status = "canceling" if self.canceling else "in_progress"
        return {
            "id": self.id,
            "type": "message_batch",
            "processing_status": status,
            "request_counts": self._counts(),
            "ended_at": batches.rfc3339(self.ended_at),
            "created_at": batches.rfc3339(self.created),
            "expires_at": batches.rfc3339(self.created + batches.WINDOW_S),
            "cancel_initiated_at": batches.rfc3339(self.cancel_initiated_at),
            "archived_at": None,
            "results_url": self.results_url,
        }

    def _counts(self) -> dict[str, int]:
        counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        if not self.ended:
            counts["processing"] = len(self.requests)
            return counts
        for status in self.statuses:
            counts[_result_type(status)] += 1
        return counts

    def result(self, index: int) -> dict[str, object]:
        """Request ``index``'s result line, rendered from its params and its status."""
        request, status = self.requests[index], self.statuses[index]
        kind = _result_type(status)
        result: dict[str, object] = {"type": kind}
        if kind == "errored":
            result["error"] = self._error(request, status)
        elif kind == "succeeded":
            chat = messages_request_from(orjson.loads(request.params))
            message = message_payload(chat, chat.triggers().reply_bytes)
            message["id"] = "msg_" + batches.derived_hex(12, self.id, index)
            result["message"] = message
        return {"custom_id": request.custom_id, "result": result}

    def _error(self, request: Request, status: int) -> dict[str, object]:
        try:
            chat = messages_request_from(orjson.loads(request.params))
        except InvalidRequest as exc:
            return anthropic_error_payload(exc.status, str(exc))
        if batches.is_batch_error(chat):
            return anthropic_error_payload(batches.BATCH_ERROR_STATUS, batches.BATCH_ERROR_MESSAGE)
        return anthropic_error_payload(status, f"simulated status {status}")

    def render(self, halfway: batches.Halfway) -> AsyncIterator[bytes]:
        """The results as JSONL, last request first (results come in no set order),
        ``halfway`` awaited once half of them are out."""
        return batches.jsonl_chunks(
            len(self.requests), lambda index: orjson.dumps(self.result(index)) + b"\n", halfway
        )


def _result_type(status: int) -> str:
    if status == 200:
        return "succeeded"
    if status == batches.EXPIRED:
        return "expired"
    return "canceled" if status == CANCELED else "errored"


def _error(status: int, message: str) -> web.Response:
    return anthropic_error_response(status, message)


def _requests_problem(data: Any) -> str | None:
    """What is wrong with a create body, as the API words it, or ``None``."""
    requests = data.get("requests") if isinstance(data, dict) else None
    if not isinstance(requests, list) or not requests:
        return "requests: Input should be a non-empty list"
    if len(requests) > MAX_REQUESTS:
        return f"requests: a batch holds at most {MAX_REQUESTS} requests"
    seen: set[str] = set()
    for index, item in enumerate(requests):
        where = f"requests.{index}"
        custom_id = item.get("custom_id") if isinstance(item, dict) else None
        if not isinstance(custom_id, str) or not CUSTOM_ID.fullmatch(custom_id):
            return f"{where}.custom_id: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
        if custom_id in seen:
            return f"{where}.custom_id: custom_id '{custom_id}' is not unique in the batch"
        seen.add(custom_id)
        if not isinstance(item.get("params"), dict):
            return f"{where}.params: Input should be an object"
    return None


class AnthropicBatches(batches.BatchApi):
    """The Message Batches routes and their in-memory state."""

    _batches: dict[str, MessageBatch]

    def reset(self) -> None:
        """Forget every batch."""
        self._batches = {}

    def add_routes(self, router: web.UrlDispatcher) -> None:
        """Register the endpoints."""
        base = "/v1/messages/batches"
        router.add_post(base, self.create)
        router.add_get(base, self.list_batches)
        router.add_get(base + "/{batch_id}", self.retrieve)
        router.add_delete(base + "/{batch_id}", self.delete)
        router.add_get(base + "/{batch_id}/results", self.results)
        router.add_post(base + "/{batch_id}/cancel", self.cancel)

    async def create(self, request: web.Request) -> web.Response:
        """``POST /v1/messages/batches``: ``{requests: [{custom_id, params}]}``."""
        refused = _refused(request)
        if refused is not None:
            return refused
        if (request.content_length or 0) > MAX_BODY_BYTES:
            return _error(413, f"request body exceeds {MAX_BODY_BYTES} bytes")
        body = await batches.read_bounded(request.content, MAX_BODY_BYTES)
        if body is None:
            return _error(413, f"request body exceeds {MAX_BODY_BYTES} bytes")
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return _error(400, "request body is not valid JSON")
        problem = _requests_problem(data)
        if problem is not None:
            return _error(400, problem)
        requests = [
            Request(item["custom_id"], orjson.dumps(item["params"])) for item in data["requests"]
        ]
        del data, body
        await self.hold_input()
        batch = MessageBatch(
            id="msgbatch_" + os.urandom(12).hex(), requests=requests, created=self._clock()
        )
        self._batches[batch.id] = batch
        self._state.count_batch(len(requests), {r.custom_id for r in requests})
        return json_response(batch.to_object())

    def _batch(self, request: web.Request) -> MessageBatch | web.Response:
        refused = _refused(request)
        if refused is not None:
            return refused
        batch_id = request.match_info["batch_id"]
        batch = self._batches.get(batch_id)
        if batch is None:
            return _error(404, f"message batch {batch_id} not found")
        return batch

    async def retrieve(self, request: web.Request) -> web.Response:
        """``GET /v1/messages/batches/{batch_id}``: the batch, moved on as time allows."""
        batch = self._batch(request)
        if isinstance(batch, web.Response):
            return batch
        await self._advance(batch, request)
        return json_response(batch.to_object())

    async def cancel(self, request: web.Request) -> web.Response:
        """``POST …/{batch_id}/cancel``: ``canceling`` now; the next poll ends it."""
        batch = self._batch(request)
        if isinstance(batch, web.Response):
            return batch
        async with batch.lock:
            if batch.ended:
                return _error(400, f"message batch {batch.id} has ended and cannot be canceled")
            if not batch.canceling:
                batch.canceling = True
                batch.cancel_initiated_at = self._clock()
        return json_response(batch.to_object())

    async def delete(self, request: web.Request) -> web.Response:
        """``DELETE /v1/messages/batches/{batch_id}``: only an ended batch."""
        batch = self._batch(request)
        if isinstance(batch, web.Response):
            return batch
        if not batch.ended:
            message = f"message batch {batch.id} is still processing; cancel it first"
            return _error(400, message)
        del self._batches[batch.id]
        return json_response({"id": batch.id, "type": "message_batch_deleted"})

    async def results(self, request: web.Request) -> web.StreamResponse:
        """``GET …/{batch_id}/results``: the result lines, streamed, once ended."""
        batch = self._batch(request)
        if isinstance(batch, web.Response):
            return batch
        if not batch.ended:
            return _error(400, f"message batch {batch.id} has not ended; no results yet")
        return await batches.stream(request, batch.render(self.halfway), "application/binary", None)

    async def list_batches(self, request: web.Request) -> web.Response:
        """``GET /v1/messages/batches?limit=&after_id=&before_id=``: newest first."""
        refused = _refused(request)
        if refused is not None:
            return refused
        limit = batches.query_limit(request.query.get("limit"), 20, 1000)
        if limit is None:
            return _error(400, "limit: Input should be an integer from 1 to 1000")
        ids = list(reversed(self._batches))
        after, before = request.query.get("after_id"), request.query.get("before_id")
        page, has_more = batches.cursor_page(ids, limit, after, before)
        data = []
        for batch_id in page:
            await self._advance(self._batches[batch_id], request)
            data.append(self._batches[batch_id].to_object())
        first, last = (page[0], page[-1]) if page else (None, None)
        return json_response(
            {"data": data, "has_more": has_more, "first_id": first, "last_id": last}
        )

    async def _advance(self, batch: MessageBatch, request: web.Request) -> None:
        async with batch.lock:
            if batch.ended:
                return
            if batch.canceling:
                batch.statuses.extend([CANCELED] * (len(batch.requests) - len(batch.statuses)))
            elif (
                not self._config.batch_stall
                and self._clock() >= batch.created + self._config.batch_delay_s
            ):
                await self._run(batch)
            else:
                return
            batch.ended_at = self._clock()
            batch.results_url = f"{request.url.origin()}/v1/messages/batches/{batch.id}/results"

    async def _run(self, batch: MessageBatch) -> None:
        """Answer the requests not answered yet, in chunks (a poll cancelled between two
        leaves the batch consistent; the next goes on)."""
        for index in range(len(batch.statuses), len(batch.requests)):
            try:
                chat = messages_request_from(orjson.loads(batch.requests[index].params))
            except InvalidRequest as exc:
                status = exc.status
            else:
                status = batches.batch_status(chat, self._state, self._config.error_rate)
                if status == 200:
                    self._state.answers.answer(chat)
            batch.statuses.append(status)
            await batches.pause_every(index)


def _refused(request: web.Request) -> web.Response | None:
    try:
        check_messages_headers(request.headers, bearer=True)
    except InvalidRequest as exc:
        return _error(exc.status, str(exc))
    return None
