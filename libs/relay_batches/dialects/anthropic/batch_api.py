"""Anthropic's Message Batches API: the requests posted in one body, the results read
back as JSONL.

Input: ``{"requests": [{"custom_id", "params"}, …]}``, each ``params`` the Messages body
the realtime call of the row would send
(:func:`relay_batches.dialects.anthropic.upstream.translate_body`: a row the Messages API
cannot take raises, and goes realtime to the alias's next deployment). The body is
streamed from disk. A batch is ``in_progress``, ``canceling`` or ``ended``; once ended its results
(``results_url``, read only on the deployment's own origin, so its key never goes
elsewhere) hold one line per request, ``result.type`` one of succeeded, errored,
canceled, expired: a succeeded one is parsed as a realtime reply, every other one (and a
row missing) goes realtime.

Message Batches carry no metadata: a record resumed after a crash between its create
call and the ledger's note of it looks for a batch created since the record (less a
minute of clock skew) with exactly its number of requests that no other record holds.
Two records of the same size created within that minute, both crashed there, could
each take the other's batch; both then still answer every row once (docs/guides/offload.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from relay_batches.dialects.anthropic import upstream
from relay_batches.dialects.endpoints import CHAT
from relay_batches.offload.lines import (
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

LIST_PAGE = 100
FIND_SLACK_S = 60.0
COUNTS = ("processing", "succeeded", "errored", "canceled", "expired")


class AnthropicBatches:
    """One ``anthropic-batch`` deployment's Message Batches calls."""

    def __init__(self, deployment: Deployment, session: aiohttp.ClientSession) -> None:
        self.deployment = deployment
        self._session = session
        self._base = f"{deployment.base_url}/messages/batches"
        origin = urlsplit(deployment.base_url)
        self._origin = f"{origin.scheme}://{origin.netloc}/"
        self._headers = {"anthropic-version": upstream.API_VERSION, **deployment.headers}
        if deployment.api_key:
            self._headers["x-api-key"] = deployment.api_key
        self._timeout = transfer_timeout(deployment)

    def line(
        self,
        offload_id: int,
        batch_id: str,
        row_index: int,
        messages: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
        endpoint: str = CHAT,
    ) -> bytes:
        """One request: the row's Messages body under its custom id (a row of another
        endpoint than chat is refused: it runs realtime)."""
        if endpoint != CHAT:
            raise UnsupportedRequest(f"a Message Batch cannot run a {endpoint} row")
        body = upstream.translate_body(self.deployment, messages, params)
        return orjson.dumps(
            {"custom_id": custom_id(offload_id, batch_id, row_index), "params": body}
        )

    def frame(self) -> tuple[bytes, bytes, bytes]:
        """One JSON object: the requests array, comma separated."""
        return b'{"requests":[', b",", b"]}"

    async def upload(self, offload_id: int, path: str) -> None:
        """Nothing to upload: the requests go with the create call."""
        return None

    async def create(self, offload_id: int, path: str, input_file_id: str | None) -> str:
        """``POST /messages/batches`` of the body at ``path`` (streamed from disk)."""
        headers = {**self._headers, "Content-Type": "application/json"}
        with open(path, "rb") as fh:  # noqa: ASYNC230 - aiohttp reads it in an executor
            data = await request_json(
                self._session, "POST", self._base, "create", headers, self._timeout, data=fh
            )
        return string_of(data, "id", "create")

    async def find(self, offload_id: int, rows: int, since: float) -> list[str]:
        """Batches created since ``since`` (less a minute) holding exactly ``rows``
        requests, newest first (the list's order)."""
        found: list[str] = []
        after: str | None = None
        while True:
            query = f"{self._base}?limit={LIST_PAGE}" + (f"&after_id={after}" if after else "")
            page = await self._json("GET", query, "list")
            items = objects(page.get("data"))
            for item in items:
                if _created(item) >= since - FIND_SLACK_S and _total(item) == rows:
                    found.append(string_of(item, "id", "list"))
            oldest = min((_created(i) for i in items), default=0.0)
            if not page.get("has_more") or not items or oldest < since - FIND_SLACK_S:
                return found
            after = string_of(page, "last_id", "list")

    async def status(self, provider_id: str) -> ProviderState:
        """``GET /messages/batches/{id}``: ended or not, progress, its results URL."""
        data = await self._json("GET", f"{self._base}/{provider_id}", "retrieve")
        counts = data.get("request_counts")
        counts = counts if isinstance(counts, dict) else {}
        progress = sum(v for k, v in counts.items() if k != "processing" and isinstance(v, int))
        if data.get("processing_status") != "ended":
            return ProviderState(False, progress)
        url = data.get("results_url")
        if not isinstance(url, str) or not url.startswith(self._origin):
            url = f"{self._base}/{provider_id}/results"
        return ProviderState(True, progress, url)

    async def cancel(self, provider_id: str) -> None:
        """``POST /messages/batches/{id}/cancel``."""
        await self._json("POST", f"{self._base}/{provider_id}/cancel", "cancel")

    async def results(self, state: ProviderState, offload_id: int) -> AsyncIterator[ResultLine]:
        """The results JSONL, streamed."""
        if state.output is None:
            return
        async with self._session.get(
            state.output, headers=self._headers, timeout=self._timeout, allow_redirects=False
        ) as response:
            await check(response, "results")
            async for line in result_lines(response, offload_id, result_line):
                yield line

    async def _json(self, method: str, url: str, what: str) -> dict[str, Any]:
        return await request_json(self._session, method, url, what, self._headers, self._timeout)


def result_line(raw: bytes, offload_id: int) -> ResultLine | None:
    """One results line; None when it names no row of this batch."""
    decoded = decoded_line(raw, offload_id)
    if decoded is None:
        return None
    key, data = decoded
    result = data.get("result")
    message = result.get("message") if isinstance(result, dict) else None
    if not isinstance(result, dict) or result.get("type") != "succeeded" or message is None:
        return ResultLine(key[0], key[1], None)
    reply = upstream.parse_reply(orjson.dumps(message))
    return ResultLine(key[0], key[1], reply if reply.completion is not None else None)


def _created(item: dict[str, Any]) -> float:
    value = item.get("created_at")
    if not isinstance(value, str):
        return 0.0
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def _total(item: dict[str, Any]) -> int:
    counts = item.get("request_counts")
    if not isinstance(counts, dict):
        return -1
    return sum(v for k, v in counts.items() if k in COUNTS and isinstance(v, int))
