"""``/webhook_endpoints``: a workspace's webhook endpoints, served by the native API
(``/v1``) and the OpenAI-compatible one (``/openai/v1``) alike, each with its own error
object.

``POST`` ``{url, events?}`` creates one: 201 with its ``whsec_`` secret, the only time it
is shown. ``url`` must pass the webhook guard now (an address the notifier would refuse
is a 400 naming ``url``); ``events`` defaults to every batch event. ``GET`` lists them
(no secret), ``DELETE /webhook_endpoints/{id}`` removes one: from then on it is sent
nothing, its pending deliveries included. See docs/guides/webhooks.md.
"""

from __future__ import annotations

import logging

from aiohttp import web

from relay_batches.errors import ApiError, ConflictError, invalid
from relay_batches.ledger.webhook_endpoints import endpoint_hex
from relay_batches.services.ingest_api.deps import DEPS
from relay_batches.services.ingest_api.edge.body import read_body
from relay_batches.services.ingest_api.edge.middleware import WORKSPACE_ID, json_response
from relay_batches.services.ingest_api.rows.job_fields import validate_webhook_url
from relay_batches.services.ingest_api.rows.validation import decode_json_object
from relay_batches.webhooks import ALL_EVENTS

log = logging.getLogger("relay.ingest_api")

JSON = "application/json"
MAX_BODY_BYTES = 16 * 1024
FIELDS = ("url", "events")
PATH = "/webhook_endpoints"


def add_webhook_endpoint_routes(app: web.Application) -> None:
    """Register the webhook endpoint routes on a surface's ``app``."""
    app.router.add_post(PATH, create_endpoint)
    app.router.add_get(PATH, list_endpoints)
    app.router.add_delete(f"{PATH}/{{id}}", delete_endpoint)


def parse_events(value: object) -> tuple[str, ...]:
    """``events``: absent (None) for every batch event, else a non-empty list of distinct
    event types; a 400 naming ``events`` or the offending ``events[i]`` otherwise."""
    if value is None:
        return ALL_EVENTS
    if not isinstance(value, list) or not value:
        raise invalid(f"events must be a non-empty list of: {', '.join(ALL_EVENTS)}", "events")
    for index, item in enumerate(value):
        if not isinstance(item, str) or item not in ALL_EVENTS:
            raise invalid(
                f"events[{index}] must be one of: {', '.join(ALL_EVENTS)}", f"events[{index}]"
            )
        if item in value[:index]:
            raise invalid(f"events[{index}] repeats {item!r}", f"events[{index}]")
    return tuple(value)


async def create_endpoint(request: web.Request) -> web.Response:
    """``POST /webhook_endpoints``: 201 with the endpoint and its secret."""
    deps = request.app[DEPS]
    workspace_id = request[WORKSPACE_ID]
    async with deps.body_gate.admit(workspace_id) as ticket:
        raw = await read_body(request, JSON, MAX_BODY_BYTES, ticket)
    body = decode_json_object(raw)
    for key in body:
        if key not in FIELDS:
            raise invalid(
                f"{key!r} is not a field of a webhook endpoint (fields: url, events)", key
            )
    if "url" not in body:
        raise invalid("url is required", "url")
    url = validate_webhook_url(body["url"], "url")
    events = parse_events(body.get("events"))
    refusal = await deps.url_guard.refusal(url)
    if refusal is not None:
        raise invalid(f"url is refused: {refusal}", "url")
    try:
        endpoint = await deps.webhook_endpoints.create(workspace_id, url, events)
    except ConflictError as exc:
        raise ApiError(409, str(exc), "url") from None
    log.info("webhook_endpoint_created", extra={"endpoint_id": endpoint.id, "events": events})
    return json_response(endpoint.to_api(), status=201)


async def list_endpoints(request: web.Request) -> web.Response:
    """``GET /webhook_endpoints``: every endpoint of the workspace, oldest first (at most
    20: one page), without secrets."""
    found = await request.app[DEPS].webhook_endpoints.list(request[WORKSPACE_ID])
    data = [e.to_api() for e in found]
    return json_response(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": False,
        }
    )


async def delete_endpoint(request: web.Request) -> web.Response:
    """``DELETE /webhook_endpoints/{id}``: ``{id, object, deleted: true}``; 404 naming
    ``id`` for an id that is not one of the workspace's endpoints."""
    shown = request.match_info["id"]
    hex_id = endpoint_hex(shown)
    deleted = hex_id is not None and await request.app[DEPS].webhook_endpoints.delete(
        request[WORKSPACE_ID], hex_id
    )
    if not deleted:
        raise ApiError(404, f"no webhook endpoint {shown[:80]!r}", "id")
    log.info("webhook_endpoint_deleted", extra={"endpoint_id": hex_id})
    return json_response({"id": shown, "object": "webhook_endpoint", "deleted": True})
