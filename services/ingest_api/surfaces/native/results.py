"""Streaming long row lists (results, dead letters) as one JSON document or as ndjson,
a keyset page at a time, so memory does not grow with the job's size; the ``partial``
and ``include`` query parameters that choose what they show."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from aiohttp import web

from relay_batches.dialects.endpoints import CHAT
from relay_batches.errors import invalid
from relay_batches.ledger.jobs import DeadLetterRow, ResultRow, RowDetails
from relay_batches.model import TERMINAL, Job, shown
from relay_batches.services.ingest_api.edge.middleware import STREAMING
from relay_batches.tool_calls import stored_tool_calls

NDJSON = "application/x-ndjson"
# The values of ``partial``, ``include`` and ``outcome`` (absent: false, no details,
# every outcome).
FLAG_VALUES = {"true": True, "false": False}
INCLUDE_VALUES = ("details",)
OUTCOME_VALUES = ("content", "error")


def single(request: web.Request, name: str) -> str | None:
    """The query parameter ``name`` given at most once (absent: None), else 400 naming it:
    a repeated flag is ambiguous, and the first value must not silently win."""
    values = request.query.getall(name, [])
    if len(values) > 1:
        raise invalid(f"{name} may be given once", name)
    return values[0] if values else None


def partial_flag(raw: str | None) -> bool:
    """The ``partial`` query parameter: ``true`` or ``false`` (absent: false), else 400."""
    if raw is None:
        return False
    if raw not in FLAG_VALUES:
        raise invalid("partial must be true or false", "partial")
    return FLAG_VALUES[raw]


def wants_details(raw: str | None) -> bool:
    """The ``include`` query parameter: ``details`` or absent, else 400."""
    if raw is None:
        return False
    if raw not in INCLUDE_VALUES:
        raise invalid(f"include must be {' or '.join(INCLUDE_VALUES)}", "include")
    return True


def outcome_filter(raw: str | None) -> str | None:
    """The ``outcome`` query parameter: ``content`` (the successes) or ``error`` (the
    failures), None when absent (every row), else 400 naming it."""
    if raw is None:
        return None
    if raw not in OUTCOME_VALUES:
        raise invalid(f"outcome must be {' or '.join(OUTCOME_VALUES)}", "outcome")
    return raw


def details_object(details: RowDetails, failed: bool) -> dict[str, Any]:
    """A row's details as the API shows them: ``usage``, ``attempts``, ``deployment``,
    ``latency_ms``, ``finish_reason`` (None for an error), and ``cost_usd`` when known."""
    fields: dict[str, Any] = {
        "usage": {
            "prompt_tokens": details.prompt_tokens,
            "completion_tokens": details.completion_tokens,
        },
        "attempts": details.attempts,
        "deployment": details.deployment,
        "latency_ms": details.latency_ms,
        "finish_reason": None if failed else details.finish_reason,
    }
    if details.cost_usd is not None:
        fields["cost_usd"] = shown(details.cost_usd)
    return fields


def row_object(row: ResultRow) -> dict[str, Any]:
    """The native per-row result (docs/api/native.md): ``{custom_id, content}`` or
    ``{custom_id, error}``, a success with ``tool_calls`` (the chat-completions array)
    when the model called tools. The stored tool calls are read back (their well-formed
    calls only), never spliced in as text, so a bad stored value cannot make the document
    invalid JSON."""
    if row.error is not None:
        shown: dict[str, Any] = {"custom_id": row.custom_id, "error": row.error}
    else:
        shown = {"custom_id": row.custom_id, "content": row.content}
        if tool_calls := stored_tool_calls(row.tool_calls):
            shown["tool_calls"] = tool_calls
    if row.details is not None:
        shown.update(details_object(row.details, row.error is not None))
    return shown


def body_row_object(row: ResultRow) -> dict[str, Any]:
    """The native per-row result of a job of another endpoint than chat:
    ``{custom_id, response}``, ``response`` the provider's JSON body as it came (the row
    worker stored it only once it parsed as a JSON object), or ``{custom_id, error}``."""
    if row.error is not None:
        shown: dict[str, Any] = {"custom_id": row.custom_id, "error": row.error}
    else:
        shown = {"custom_id": row.custom_id, "response": orjson.Fragment(row.content or "{}")}
    if row.details is not None:
        shown.update(details_object(row.details, row.error is not None))
    return shown


def dead_letter_object(row: DeadLetterRow) -> dict[str, Any]:
    """The native dead-letter row (docs/api/native.md): ``{custom_id, error, attempts}``,
    and its details when they were asked for."""
    shown = {"custom_id": row.custom_id, "error": row.error, "attempts": row.attempts}
    if row.details is not None:
        shown.update(details_object(row.details, True))
    return shown


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
    request: web.Request, job: Job, pages: AsyncIterator[list[ResultRow]], partial: bool = False
) -> web.StreamResponse:
    """The results of ``batch``: none until it is terminal, then every outcome in order;
    ``partial``: every outcome recorded so far, whatever the status (the head says so)."""
    to_object = row_object if job.endpoint == CHAT else body_row_object
    if partial:
        head: dict[str, Any] = {"id": job.id, "status": job.status, "partial": True}
        return await stream_list(request, head, pages, to_object)
    head = {"id": job.id, "status": job.status}
    return await stream_list(request, head, pages if job.status in TERMINAL else None, to_object)
