"""OpenAI's Batch API: the input uploaded through the Files API, then a batch made of it.

Input: a JSONL file (``purpose=batch``), one line per row,
``{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body"}``, the body
built exactly as the realtime call of the row
(:func:`relay_batches.dialects.openai.upstream.build_request`, or for another endpoint
:class:`relay_batches.dialects.openai.endpoints.BodyWire`). The batch is created with
its lines' ``endpoint`` (one per provider batch: its first row's), the deployment's
``window`` as its ``completion_window`` and ``metadata.relay_offload_id`` naming the
offload record, which is how a record resumed after a crash finds the batch it may
already have made.

A batch ends ``completed``, ``expired`` or ``cancelled`` (its output file holds the
answered requests, its error file the failed and expired ones) or ``failed`` (nothing
ran: every row goes realtime). A result line whose ``response.status_code`` is 200 is
parsed as a realtime reply; any other line, and a row missing from both files, goes
realtime.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import aiohttp
import orjson

from relay_batches.dialects.endpoints import answer_endpoint, body_reply
from relay_batches.dialects.openai import upstream
from relay_batches.dialects.openai.endpoints import BodyWire
from relay_batches.durations import format_duration
from relay_batches.offload.lines import (
    ProviderError,
    ProviderState,
    ResultLine,
    check,
    custom_id,
    decoded_line,
    objects,
    request_json,
    result_lines,
    string_of,
    transfer_timeout,
)
from relay_batches.router.aliases import Deployment
from relay_batches.router.types import UnsupportedRequest

ENDPOINT = "/v1/chat/completions"
ENDED = frozenset({"completed", "expired", "cancelled", "failed"})
LIST_PAGE = 100
FIND_SLACK_S = 60.0


class OpenAIBatches:
    """One ``openai-batch`` deployment's Files and Batches calls."""

    def __init__(self, deployment: Deployment, session: aiohttp.ClientSession) -> None:
        self.deployment = deployment
        self._session = session
        self._base = deployment.base_url
        self._headers = dict(deployment.headers)
        if deployment.api_key:
            self._headers["Authorization"] = f"Bearer {deployment.api_key}"
        self._timeout = transfer_timeout(deployment)
        # The endpoint of each provider batch being built (its first line's).
        self._endpoints: dict[int, str] = {}
        assert deployment.batch is not None
        # OpenAI spells its window in hours ("24h", the one it takes today).
        hours, rest = divmod(int(deployment.batch.window.total_seconds()), 3600)
        self._window = (
            f"{hours}h" if hours and not rest else format_duration(deployment.batch.window)
        )

    def line(
        self,
        offload_id: int,
        batch_id: str,
        row_index: int,
        messages: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        endpoint: str = ENDPOINT,
    ) -> bytes:
        """One input line: the row's body under its custom id, built as its realtime
        call would be. A provider batch runs one endpoint, its first row's: a row of
        another endpoint, or of one the deployment does not serve, is refused (it runs
        realtime)."""
        if endpoint not in self.deployment.endpoints:
            raise UnsupportedRequest(f"deployment does not serve {endpoint}")
        first = self._endpoints.setdefault(offload_id, endpoint)
        if endpoint != first:
            raise UnsupportedRequest(f"a {endpoint} row in a {first} provider batch")
        wire: Any = upstream if endpoint == ENDPOINT else BodyWire(endpoint)
        _, _, body = wire.build_request(self.deployment, messages, params)
        return orjson.dumps(
            {
                "custom_id": custom_id(offload_id, batch_id, row_index),
                "method": "POST",
                "url": endpoint,
                "body": orjson.Fragment(body),
            }
        )

    def frame(self) -> tuple[bytes, bytes, bytes]:
        """JSONL: no opening, a newline after every line."""
        return b"", b"\n", b"\n"

    async def upload(self, offload_id: int, path: str) -> str:
        """``POST /files`` of the input (streamed from disk); the file's id."""
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        with open(path, "rb") as fh:  # noqa: ASYNC230 - aiohttp reads it in an executor
            form.add_field(
                "file",
                fh,
                filename=f"relay-offload-{offload_id}.jsonl",
                content_type="application/jsonl",
            )
            data = await self._json("POST", "/files", "upload", data=form)
        return string_of(data, "id", "upload")

    async def create(self, offload_id: int, path: str, input_file_id: str | None) -> str:
        """``POST /batches`` of the uploaded file; the batch's id."""
        if input_file_id is None:
            raise ProviderError("create: no input file uploaded", permanent=True)
        endpoint = self._endpoints.pop(offload_id, None) or await asyncio.to_thread(
            _first_url, path
        )
        body = {
            "input_file_id": input_file_id,
            "endpoint": endpoint,
            "completion_window": self._window,
            "metadata": {"relay_offload_id": str(offload_id)},
        }
        data = await self._json("POST", "/batches", "create", json=body)
        return string_of(data, "id", "create")

    async def find(self, offload_id: int, rows: int, since: float) -> list[str]:
        """Batches whose ``metadata.relay_offload_id`` names the record, among those
        created since ``since`` (less a minute of clock skew), newest first."""
        found: list[str] = []
        after: str | None = None
        while True:
            query = f"/batches?limit={LIST_PAGE}" + (f"&after={after}" if after else "")
            page = await self._json("GET", query, "list")
            items = objects(page.get("data"))
            for item in items:
                metadata = item.get("metadata")
                if isinstance(metadata, dict) and metadata.get("relay_offload_id") == str(
                    offload_id
                ):
                    found.append(string_of(item, "id", "list"))
            oldest = min((_created(i) for i in items), default=0.0)
            if not page.get("has_more") or not items or oldest < since - FIND_SLACK_S:
                return found
            after = string_of(items[-1], "id", "list")

    async def status(self, provider_id: str) -> ProviderState:
        """``GET /batches/{id}``: ended or not, progress, where the results are."""
        data = await self._json("GET", f"/batches/{provider_id}", "retrieve")
        status = data.get("status")
        counts = data.get("request_counts")
        counts = counts if isinstance(counts, dict) else {}
        progress = sum(v for k, v in counts.items() if k != "total" and isinstance(v, int))
        if status not in ENDED:
            return ProviderState(False, progress)
        if status == "failed":
            return ProviderState(True, progress, failed=_failure(data))
        return ProviderState(
            True, progress, _optional(data, "output_file_id"), _optional(data, "error_file_id")
        )

    async def cancel(self, provider_id: str) -> None:
        """``POST /batches/{id}/cancel``."""
        await self._json("POST", f"/batches/{provider_id}/cancel", "cancel")

    async def results(self, state: ProviderState, offload_id: int) -> AsyncIterator[ResultLine]:
        """The output file's lines, then the error file's, streamed."""
        for file_id in (state.output, state.errors):
            if file_id is None:
                continue
            async with self._session.get(
                f"{self._base}/files/{file_id}/content",
                headers=self._headers,
                timeout=self._timeout,
                allow_redirects=False,
            ) as response:
                await check(response, "results")
                async for line in result_lines(response, offload_id, result_line):
                    yield line

    async def _json(self, method: str, path: str, what: str, **kwargs: Any) -> dict[str, Any]:
        return await request_json(
            self._session,
            method,
            self._base + path,
            what,
            self._headers,
            self._timeout,
            **kwargs,
        )


def result_line(raw: bytes, offload_id: int) -> ResultLine | None:
    """One output or error file line; None when it names no row of this batch."""
    decoded = decoded_line(raw, offload_id)
    if decoded is None:
        return None
    key, data = decoded
    response = data.get("response")
    body = response.get("body") if isinstance(response, dict) else None
    if not isinstance(response, dict) or response.get("status_code") != 200 or body is None:
        return ResultLine(key[0], key[1], None)
    raw_body = orjson.dumps(body)
    endpoint = answer_endpoint(body) if isinstance(body, dict) else ENDPOINT
    reply = (
        upstream.parse_reply(raw_body) if endpoint == ENDPOINT else body_reply(endpoint, raw_body)
    )
    return ResultLine(key[0], key[1], reply if reply.completion is not None else None)


def _first_url(path: str) -> str:
    """The ``url`` of an input file's first line (a record resumed after a restart has
    no endpoint in memory); chat when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            url = orjson.loads(fh.readline()).get("url")
    except (OSError, orjson.JSONDecodeError, AttributeError):
        return ENDPOINT
    return url if isinstance(url, str) else ENDPOINT


def _optional(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) and value else None


def _created(item: dict[str, Any]) -> float:
    value = item.get("created_at")
    return float(value) if isinstance(value, int | float) else 0.0


def _failure(data: dict[str, Any]) -> str:
    """Why a batch failed, from its ``errors`` list (the first message)."""
    errors = data.get("errors")
    items = errors.get("data") if isinstance(errors, dict) else None
    if isinstance(items, list) and items and isinstance(items[0], dict):
        message = items[0].get("message")
        if isinstance(message, str):
            return message[:200]
    return "the provider batch failed"
