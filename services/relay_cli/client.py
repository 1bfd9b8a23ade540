"""A small client of Relay's public API for the ``relay batch`` commands (aiohttp).

Every call has a connect and a read timeout. Any failure becomes :class:`ApiFailure`,
whose :meth:`ApiFailure.line` is the one readable line the command prints.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
import orjson

CONNECT_TIMEOUT_S = 10.0
NDJSON = "application/x-ndjson"
CHUNK_BYTES = 64 * 1024


class ApiFailure(Exception):
    """An error answer of the API, or no answer at all."""

    def __init__(
        self, message: str, status: int = 0, error_type: str = "", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.error_type = error_type
        self.param = param

    def line(self) -> str:
        """``invalid API key (401 authentication_error)``: one line for the terminal."""
        if not self.status:
            return self.message
        where = f", param {self.param}" if self.param else ""
        return f"{self.message} ({self.status} {self.error_type}{where})"


def _one_line(text: str) -> str:
    return " ".join(text.split())


async def _failure(response: aiohttp.ClientResponse) -> ApiFailure:
    raw = await response.read()
    try:
        error = orjson.loads(raw)["error"]
        return ApiFailure(
            _one_line(str(error["message"])),
            response.status,
            str(error.get("type", "")),
            error.get("param"),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError):
        text = _one_line(raw[:200].decode("utf-8", "replace")) or response.reason or ""
        return ApiFailure(f"HTTP {response.status} {text}".strip(), response.status, "http_error")


class RelayClient:
    """``async with RelayClient(url, key, timeout_s) as client: await client.get(id)``."""

    def __init__(self, url: str, api_key: str, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=CONNECT_TIMEOUT_S, sock_read=timeout_s
        )
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> RelayClient:
        self._session = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._session is not None:
            await self._session.close()

    @contextlib.asynccontextmanager
    async def _call(
        self, method: str, path: str, **kw: Any
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        assert self._session is not None, "use RelayClient as an async context manager"
        try:
            async with self._session.request(method, self.url + path, **kw) as response:
                if response.status >= 400:
                    raise await _failure(response)
                yield response
        except aiohttp.ClientPayloadError as exc:
            # The answer began but broke off (the server aborted a stream): never a result.
            reason = _one_line(str(exc)) or type(exc).__name__
            raise ApiFailure(f"incomplete response from {self.url}: {reason}") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason = _one_line(str(exc)) or type(exc).__name__
            raise ApiFailure(f"cannot reach {self.url}: {reason}") from None

    async def _json(self, method: str, path: str, **kw: Any) -> Any:
        async with self._call(method, path, **kw) as response:
            return orjson.loads(await response.read())

    async def upload(self, files: Sequence[Path], fields: dict[str, str]) -> list[dict[str, Any]]:
        """``POST /v1/batches/upload``: one job per file; the created batches in order."""
        with contextlib.ExitStack() as stack:
            form = aiohttp.FormData(default_to_multipart=True)
            for name, value in fields.items():
                form.add_field(name, value)
            for path in files:
                handle = stack.enter_context(path.open("rb"))
                form.add_field("file", handle, filename=path.name, content_type="text/plain")
            body = await self._json("POST", "/v1/batches/upload", data=form)
        return list(body["data"])

    async def get(self, batch_id: str) -> dict[str, Any]:
        """``GET /v1/batches/{id}``."""
        return dict(await self._json("GET", f"/v1/batches/{batch_id}"))

    async def list_page(
        self, limit: int, status: str | None = None, after: str | None = None
    ) -> dict[str, Any]:
        """``GET /v1/batches``: one page, newest first."""
        params = {"limit": str(limit)}
        if status:
            params["status"] = status
        if after:
            params["after"] = after
        return dict(await self._json("GET", "/v1/batches", params=params))

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        """``POST /v1/batches/{id}/cancel``."""
        return dict(await self._json("POST", f"/v1/batches/{batch_id}/cancel"))

    async def delete(self, batch_id: str) -> dict[str, Any]:
        """``DELETE /v1/batches/{id}``: ``{id, object: "batch.deleted", deleted: true}``."""
        return dict(await self._json("DELETE", f"/v1/batches/{batch_id}"))

    async def pause(self, batch_id: str) -> dict[str, Any]:
        """``POST /v1/batches/{id}/pause``."""
        return dict(await self._json("POST", f"/v1/batches/{batch_id}/pause"))

    async def resume(self, batch_id: str) -> dict[str, Any]:
        """``POST /v1/batches/{id}/resume``."""
        return dict(await self._json("POST", f"/v1/batches/{batch_id}/resume"))

    async def retry(self, batch_id: str, rows: str) -> dict[str, Any]:
        """``POST /v1/batches/{id}/retry`` with ``{"rows": rows}``: the new batch."""
        body = orjson.dumps({"rows": rows})
        headers = {"Content-Type": "application/json"}
        return dict(
            await self._json("POST", f"/v1/batches/{batch_id}/retry", data=body, headers=headers)
        )

    async def deliveries(
        self, batch_id: str, limit: int = 100, after: str | None = None
    ) -> dict[str, Any]:
        """``GET /v1/batches/{id}/webhook_deliveries``: one page of attempts, oldest first."""
        params = {"limit": str(limit)}
        if after:
            params["after"] = after
        path = f"/v1/batches/{batch_id}/webhook_deliveries"
        return dict(await self._json("GET", path, params=params))

    async def redeliver(self, batch_id: str) -> dict[str, Any]:
        """``POST /v1/batches/{id}/webhook_deliveries``: a redelivery scheduled."""
        path = f"/v1/batches/{batch_id}/webhook_deliveries"
        return dict(await self._json("POST", path))

    async def models(self) -> dict[str, Any]:
        """``GET /v1/models``: ``{object: list, data: [{id, object: model}]}``."""
        return dict(await self._json("GET", "/v1/models"))

    def results(
        self,
        batch_id: str,
        outcome: str | None = None,
        partial: bool = False,
        details: bool = False,
    ) -> AsyncIterator[bytes]:
        """The job's results as ndjson bytes, chunk by chunk (one JSON object a line):
        only the rows of ``outcome`` (``error``, ``content``) when given, those finished
        so far with ``partial``, each with its details with ``details``."""
        params = {"outcome": outcome} if outcome else {}
        if partial:
            params["partial"] = "true"
        if details:
            params["include"] = "details"
        return self._ndjson(f"/v1/batches/{batch_id}/results", params)

    def dead_letters(self, batch_id: str, details: bool = False) -> AsyncIterator[bytes]:
        """The job's dead-letter rows as ndjson bytes, chunk by chunk."""
        params = {"include": "details"} if details else {}
        return self._ndjson(f"/v1/batches/{batch_id}/dead_letter", params)

    async def _ndjson(self, path: str, params: dict[str, str]) -> AsyncIterator[bytes]:
        headers = {"Accept": NDJSON}
        async with self._call("GET", path, headers=headers, params=params) as response:
            async for chunk in response.content.iter_chunked(CHUNK_BYTES):
                yield chunk
