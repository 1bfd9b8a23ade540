"""Driving the Anthropic-compatible surface as a user would: the official SDK, pointed at
Relay, and raw HTTP whose every object is checked strictly against the SDK's own types."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
from anthropic import AsyncAnthropic
from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse

BATCH_KEYS = {
    "id",
    "type",
    "processing_status",
    "request_counts",
    "created_at",
    "expires_at",
    "ended_at",
    "cancel_initiated_at",
    "archived_at",
    "results_url",
}
BATCHES = "/anthropic/v1/messages/batches"


def sdk_client(api_url: str, key: str) -> AsyncAnthropic:
    """The SDK as a user configures it for Relay (no retries: a test sees every answer)."""
    return AsyncAnthropic(base_url=f"{api_url}/anthropic", api_key=key, max_retries=0)


def params(text: str, model: str = "gpt-4o-mini", **extra: Any) -> dict[str, Any]:
    """Messages params of one user turn."""
    return {
        "model": model,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": text}],
        **extra,
    }


class RawAnthropic:
    """Raw requests to the surface, with the key as the SDK sends it (``x-api-key``)."""

    def __init__(self, api_url: str, key: str, http: aiohttp.ClientSession) -> None:
        self.api_url = api_url
        self.key = key
        self._http = http

    async def call(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        """``(status, decoded JSON)`` of one request to ``BATCHES + path``."""
        sent = {"x-api-key": self.key, "anthropic-version": "2023-06-01", **(headers or {})}
        data = None
        if body is not None:
            data = orjson.dumps(body)
            sent["Content-Type"] = "application/json"
        async with self._http.request(
            method, f"{self.api_url}{BATCHES}{path}", data=data, headers=sent
        ) as response:
            raw = await response.read()
            return response.status, orjson.loads(raw) if raw else None

    async def batch(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """A request answered 200 with a Message Batch, checked strictly; the raw JSON."""
        status, data = await self.call(method, path, body)
        assert status == 200, (status, data)
        return strict_batch(data)

    async def results(self, url: str) -> list[MessageBatchIndividualResponse]:
        """The JSON lines at ``url`` (a batch's ``results_url``), each checked strictly."""
        async with self._http.get(url, headers={"x-api-key": self.key}) as response:
            assert response.status == 200, await response.text()
            assert response.content_type == "application/x-jsonl"
            body = await response.read()
        assert body.endswith(b"\n")
        return [strict_line(orjson.loads(line)) for line in body.splitlines()]


def strict_batch(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` is a Message Batch exactly: every key, SDK-valid; returned unchanged."""
    assert set(data) == BATCH_KEYS, data
    MessageBatch.model_validate(data)
    return data


def strict_line(data: dict[str, Any]) -> MessageBatchIndividualResponse:
    """One results line, SDK-valid."""
    assert set(data) == {"custom_id", "result"}, data
    return MessageBatchIndividualResponse.model_validate(data)


def error_of(data: Any) -> tuple[str, str]:
    """``(type, message)`` of Anthropic's error object, insisting on its shape."""
    assert set(data) == {"type", "error"} and data["type"] == "error", data
    assert set(data["error"]) == {"type", "message"}, data
    return data["error"]["type"], data["error"]["message"]
