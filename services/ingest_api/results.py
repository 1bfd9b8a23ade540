"""Streaming long row lists (results, dead letters) as one JSON document or as ndjson,
a keyset page at a time, so memory does not grow with the job's size."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from aiohttp import web

from relay_batches.ledger.jobs import DeadLetterRow, ResultRow
from relay_batches.model import TERMINAL, Job
from relay_batches.services.ingest_api.middleware import STREAMING
from relay_batches.tool_calls import stored_tool_calls

NDJSON = "application/x-ndjson"


def row_object(row: ResultRow) -> dict[str, Any]:
    """API.md's per-row result: ``{custom_id, content}`` or ``{custom_id, error}``, a
    success with ``tool_calls`` (the chat-completions array) when the model called tools.
    The stored tool calls are read back (their well-formed calls only), never spliced in
    as text, so a bad stored value cannot make the document invalid JSON."""
    if row.error is not None:
        return {"custom_id": row.custom_id, "error": row.error}
    tool_calls = stored_tool_calls(row.tool_calls)
    if not tool_calls:
        return {"custom_id": row.custom_id, "content": row.content}
    return {"custom_id": row.custom_id, "content": row.content, "tool_calls": tool_calls}


def dead_letter_object(row: DeadLetterRow) -> dict[str, Any]:
    """API.md's dead-letter row: ``{custom_id, error, attempts}``."""
    return {"custom_id": row.custom_id, "error": row.error, "attempts": row.attempts}


def wants_ndjson(request: web.Request) -> bool:
    """True when the client asked for ``application/x-ndjson``."""
    return NDJSON in request.headers.get("Accept", "")


async def stream_list(
    request: web.Request,
    head: dict[str, Any],
    pages: AsyncIterator[list[Any]] | None,
    to_object: Callable[[Any], dict[str, Any]],
) -> web.StreamResponse:
    """Write ``{**head, "data": [...]}`` (or one object per line for ndjson) page by page.

    ``pages`` None means an empty list.
    """
    ndjson = wants_ndjson(request)
    response = web.StreamResponse(
        headers={"Content-Type": NDJSON if ndjson else "application/json"}
    )
    await response.prepare(request)
    request[STREAMING] = True  # from here on a failure can only abort the connection
    dumps = orjson.dumps
    if ndjson:
        if pages is not None:
            async for page in pages:
                await response.write(b"".join(dumps(to_object(r)) + b"\n" for r in page))
    else:
        await response.write(dumps(head)[:-1] + (b',"data":[' if head else b'{"data":['))
        first = True
        if pages is not None:
            async for page in pages:
                # One encoder call per page: the array's brackets are dropped to splice it.
                chunk = dumps([to_object(r) for r in page])[1:-1]
                await response.write(chunk if first else b"," + chunk)
                first = False
        await response.write(b"]}")
    await response.write_eof()
    return response


async def stream_results(
    request: web.Request, job: Job, pages: AsyncIterator[list[ResultRow]]
) -> web.StreamResponse:
    """The results of ``batch``: none until it is terminal, then every outcome in order."""
    head = {"id": job.id, "status": job.status}
    return await stream_list(request, head, pages if job.status in TERMINAL else None, row_object)
