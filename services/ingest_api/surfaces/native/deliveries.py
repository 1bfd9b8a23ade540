"""``/v1/batches/{id}/webhook_deliveries``: a batch's completion-webhook delivery log,
and a redelivery of its completion summary asked for now; with ``?endpoint_id=we_…``, the
same for the event the batch sent to one of the workspace's webhook endpoints."""

from __future__ import annotations

import logging

from aiohttp import web

from relay_batches.errors import ApiError, ConflictError, invalid
from relay_batches.ledger.webhook_endpoints import endpoint_hex
from relay_batches.model import TERMINAL, iso
from relay_batches.services.ingest_api.deps import DEPS
from relay_batches.services.ingest_api.edge.middleware import json_response
from relay_batches.services.ingest_api.edge.paging import page_limit
from relay_batches.services.ingest_api.surfaces.native.batches import _find

log = logging.getLogger("relay.ingest_api")

MAX_ATTEMPTS_PAGE = 100
ATTEMPT_DIGITS = 9  # an attempt number in an ``after`` cursor (the log never gets near)


def add_delivery_routes(app: web.Application) -> None:
    """Register the delivery log and redelivery routes on ``app``."""
    path = "/batches/{id}/webhook_deliveries"
    app.router.add_get(path, list_deliveries)
    app.router.add_post(path, redeliver)


async def list_deliveries(request: web.Request) -> web.Response:
    """``GET /v1/batches/{id}/webhook_deliveries``: every attempt, oldest first, with
    the delivery's status and next attempt (``limit``/``after``)."""
    job = await _find(request)
    endpoint_id = _endpoint(request)
    limit = page_limit(request.query.get("limit"), MAX_ATTEMPTS_PAGE, MAX_ATTEMPTS_PAGE)
    after = _after(request.query.get("after"), job.id)
    page = await request.app[DEPS].delivery_log.attempts(job.id, after, limit, endpoint_id)
    return json_response(
        {
            "object": "list",
            "batch_id": job.id,
            **_named(request),
            "status": page.status,
            "next_attempt_at": iso(page.next_attempt_at),
            "data": [a.to_api() for a in page.attempts],
            "has_more": page.has_more,
        }
    )


def _endpoint(request: web.Request) -> str:
    """The 32-hex id of the ``endpoint_id`` query parameter (``we_<hex>``); '' when it is
    absent (the batch's own webhook); 400 naming it when it is not an endpoint id."""
    raw = request.query.get("endpoint_id")
    if raw is None:
        return ""
    hex_id = endpoint_hex(raw)
    if hex_id is None:
        raise invalid("endpoint_id must be a webhook endpoint id (we_<32 hex>)", "endpoint_id")
    return hex_id


def _named(request: web.Request) -> dict[str, str]:
    """``{"endpoint_id": …}`` when the request named an endpoint, else nothing."""
    raw = request.query.get("endpoint_id")
    return {} if raw is None else {"endpoint_id": raw}


def _after(raw: str | None, batch_id: str) -> int:
    """The ``after`` cursor (an attempt id of this batch, ``<batch id>.<n>``) as the
    attempt number to list after; 0 when absent; 400 naming ``after`` otherwise."""
    if raw is None:
        return 0
    prefix, dot, number = raw.rpartition(".")
    if (
        prefix != batch_id
        or not dot
        or not (number.isascii() and number.isdigit() and len(number) <= ATTEMPT_DIGITS)
    ):
        raise invalid(f"after must be an attempt id of this batch, like {batch_id}.1", "after")
    return int(number)


async def redeliver(request: web.Request) -> web.Response:
    """``POST /v1/batches/{id}/webhook_deliveries``: 202 once the completion summary is
    due at once, with the delivery's stored status (``retrying``, or ``sending`` for a
    first delivery still waiting unclaimed) and due time, as GET shows them; 409 for a
    job not terminal, a cron template, an attempt under way, a last attempt that ended
    less than 10 s ago, or a delivery at its 100 attempts; 400 for a batch without a
    webhook URL."""
    job = await _find(request)
    endpoint_id = _endpoint(request)
    if job.cron is not None:
        raise ApiError(409, "a cron template has no webhook of its own; its runs do", "id")
    if not job.webhook_url and not endpoint_id:
        raise invalid("the batch has no webhook URL to deliver to", "webhook_url")
    if job.status not in TERMINAL:
        raise ApiError(409, f"batch is {job.status}: its webhook is sent when it ends", "id")
    try:
        scheduled = await request.app[DEPS].delivery_log.request_redelivery(job, endpoint_id)
    except ConflictError as exc:
        raise ApiError(409, str(exc), "endpoint_id" if endpoint_id else "id") from None
    log.info(
        "webhook_redelivery_requested",
        extra={"batch_id": job.id, "endpoint_id": endpoint_id or None},
    )
    return json_response(
        {
            "object": "webhook_delivery.scheduled",
            "batch_id": job.id,
            **_named(request),
            "status": scheduled.status,
            "next_attempt_at": iso(scheduled.next_attempt_at),
        },
        status=202,
    )
