"""``POST /v1/batches/estimate``: what a job would cost and when it would finish, before
it is submitted (docs/guides/estimate.md).

The body is that of ``POST /v1/batches`` (its rows counted as they are decoded, in the
parser executor), or ``{"input_file_id": "file-…"}`` with the job-level fields, naming an
input file uploaded through ``/openai/v1/files`` (its stored rows read a keyset page at a
time and counted in the parser executor, so a file of a million rows is never held
whole). Nothing is stored: the answer is :meth:`relay_batches.estimate.pricing.Estimate.to_api`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from typing import Any

import orjson
from aiohttp import web

from relay_batches.errors import ApiError, invalid
from relay_batches.estimate.pricing import lane_offers, price_estimate
from relay_batches.estimate.tally import Tally
from relay_batches.ledger.files import INPUT_PURPOSE
from relay_batches.ledger.lane_rates import measured_rates
from relay_batches.ledger.usage import UsageStore
from relay_batches.services.ingest_api.deps import DEPS, ApiDeps
from relay_batches.services.ingest_api.edge.body import read_body
from relay_batches.services.ingest_api.edge.middleware import WORKSPACE_ID, json_response
from relay_batches.services.ingest_api.rows.job_fields import BatchOptions
from relay_batches.services.ingest_api.rows.validation import (
    RowInput,
    decode_json_object,
    scan_submit,
)
from relay_batches.services.ingest_api.submit import job_fields, row_models
from relay_batches.services.ingest_api.surfaces.openai.files import file_hex

JSON = "application/json"
FILE_KEY = "input_file_id"
FILE_BODY_BYTES = 64 * 1024  # a body naming a file: its job-level fields, no rows
PAGE_ROWS = 2_000  # stored requests read and counted at once


def add_estimate_routes(app: web.Application) -> None:
    """Register ``POST /v1/batches/estimate``."""
    app.router.add_post("/batches/estimate", estimate_batch)


def _naming_file(raw: bytes | bytearray) -> dict[str, object] | None:
    """The decoded body when it names an input file (a small object with
    ``input_file_id``), else None: a create body, counted as it is scanned."""
    if len(raw) > FILE_BODY_BYTES or f'"{FILE_KEY}"'.encode() not in raw:
        return None
    payload = decode_json_object(raw)
    return payload if FILE_KEY in payload else None


async def estimate_batch(request: web.Request) -> web.Response:
    """``POST /v1/batches/estimate``: rows, tokens, the cost per lane and of the plan
    Relay would choose, and the expected finish."""
    deps = request.app[DEPS]
    workspace_id = request[WORKSPACE_ID]
    if deps.aliases is None:
        raise ApiError(503, "the routes are not loaded", "model")
    usage = UsageStore(deps.pool)
    loop = asyncio.get_running_loop()
    async with deps.body_gate.admit(workspace_id) as ticket:
        raw = await read_body(request, JSON, deps.max_json_body_bytes, ticket)
        executor = deps.parser_for(ticket.large)
        named = await loop.run_in_executor(executor, _naming_file, raw)
        if named is None:
            spec = await loop.run_in_executor(
                executor, scan_submit, raw, deps.limits, row_models(deps)
            )
            del raw
            options = spec.options
            tally = Tally(
                _params(options), await usage.mean_completion(workspace_id, options.model)
            )
            await loop.run_in_executor(executor, tally.add_page, _requests_of(spec.rows))
            del spec
        else:
            options, tally = await _file_tally(deps, usage, workspace_id, named)
    measured = await measured_rates(deps.pool, [options.model])
    offers = lane_offers(deps.aliases, options.model, measured)
    window = options.completion_window
    estimate = price_estimate(
        tally,
        offers,
        None if window is None else window.total_seconds(),
        options.budget_usd,
    )
    return json_response(estimate.to_api())


def _params(options: BatchOptions) -> dict[str, Any]:
    params: dict[str, Any] = orjson.loads(options.params_json)
    return params


async def _file_tally(
    deps: ApiDeps, usage: UsageStore, workspace_id: str, payload: dict[str, object]
) -> tuple[BatchOptions, Tally]:
    """The job-level fields of a body naming a file, and its stored rows counted a page
    at a time (each page in the parser executor)."""
    file_id = payload.pop(FILE_KEY)
    hex_id = file_hex(file_id) if isinstance(file_id, str) else None
    stored = None if hex_id is None else await deps.files.get(workspace_id, hex_id)
    if stored is None or stored.purpose != INPUT_PURPOSE:
        raise ApiError(404, f"no input file {file_id!r}", FILE_KEY)
    if "model" not in payload and stored.model is not None:
        payload["model"] = stored.model
    options = job_fields(payload, deps)
    tally = Tally(_params(options), await usage.mean_completion(workspace_id, options.model))
    loop = asyncio.get_running_loop()
    after = -1
    while page := await usage.stored_requests(stored.id, after, PAGE_ROWS):
        after = page[-1][0]
        await loop.run_in_executor(deps.small_parser, tally.add_page, _texts(page))
    if tally.rows == 0:
        raise invalid(f"input file {file_id!r} has no rows", FILE_KEY)
    return options, tally


def _texts(page: list[tuple[int, str]]) -> Iterable[str]:
    return [text for _, text in page]


def _requests_of(rows: Iterable[RowInput]) -> Iterator[str]:
    """The stored requests of validated rows, read as they are counted (no copy)."""
    return (row.request_json for row in rows)
