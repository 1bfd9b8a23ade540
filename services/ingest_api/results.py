"""Streaming a job's results as one JSON document or as ndjson, a page at a time."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
from aiohttp import web

from relay.batches import TERMINAL, Batch
from relay.ledger.jobs import ResultRow

NDJSON = "application/x-ndjson"

Pages = AsyncIterator[list[ResultRow]]


def row_object(row: ResultRow) -> dict[str, str | None]:
    """API.md's per-row result: ``{custom_id, content}`` or ``{custom_id, error}``."""
    if row.error is None:
        return {"custom_id": row.custom_id, "content": row.content}
    return {"custom_id": row.custom_id, "error": row.error}


def wants_ndjson(request: web.Request) -> bool:
    """True when the client asked for ``application/x-ndjson``."""
    return NDJSON in request.headers.get("Accept", "")


async def stream_results(request: web.Request, batch: Batch, pages: Pages) -> web.StreamResponse:
    """Write the results of ``batch`` (none until it is terminal) page by page."""
    ndjson = wants_ndjson(request)
    response = web.StreamResponse(
        headers={"Content-Type": NDJSON if ndjson else "application/json"}
    )
    await response.prepare(request)
    if batch.status not in TERMINAL:
        if not ndjson:
            await response.write(_head(batch) + b"]}")
        await response.write_eof()
        return response
    if ndjson:
        async for page in pages:
            await response.write(b"".join(orjson.dumps(row_object(r)) + b"\n" for r in page))
    else:
        await response.write(_head(batch))
        first = True
        async for page in pages:
            chunk = b",".join(orjson.dumps(row_object(r)) for r in page)
            await response.write(chunk if first else b"," + chunk)
            first = False
        await response.write(b"]}")
    await response.write_eof()
    return response


def _head(batch: Batch) -> bytes:
    prefix = orjson.dumps({"id": batch.id, "status": batch.status})
    return prefix[:-1] + b',"data":['
