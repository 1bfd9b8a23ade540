"""The OpenAPI paths of the native surface's webhooks: a batch's delivery log and
redelivery (``/v1/batches/{id}/webhook_deliveries``) and the workspace's webhook
endpoints (``/v1/webhook_endpoints``)."""

from __future__ import annotations

from typing import Any

from relay_batches.services.ingest_api import webhook_endpoint_shapes as endpoints
from relay_batches.services.ingest_api.surfaces.native import outcomes
from relay_batches.services.ingest_api.surfaces.native.deliveries import (
    ATTEMPT_DIGITS,
    MAX_ATTEMPTS_PAGE,
)
from relay_batches.services.ingest_api.surfaces.native.document import (
    BODY_ERRORS,
    json,
    operation,
    query,
    schema,
)


def webhook_deliveries_path() -> dict[str, Any]:
    """``/v1/batches/{id}/webhook_deliveries``: the log, and a redelivery."""
    endpoint = query(
        "endpoint_id",
        "A webhook endpoint of the workspace (`we_<32 hex>`): the log (or a redelivery) of"
        " the event the batch sent it, instead of the batch's own completion webhook; 400"
        " when malformed; a redelivery for an endpoint the batch sent no event is 409.",
        {"type": "string", "pattern": endpoints.ENDPOINT_ID},
    )
    return {
        "get": operation(
            "listWebhookDeliveries",
            "The completion webhook's delivery log",
            {"200": json(outcomes.WebhookDeliveries, "A page of the delivery log.")},
            (400, 404),
            description="Every attempt to POST the batch's completion webhook, oldest first,"
            " with the delivery's status and when its next attempt is due (a retry, or a"
            " redelivery asked for). A batch without a delivery yet has `status: null` and no"
            " attempts.",
            parameters=[
                query(
                    "limit",
                    f"Page size, default {MAX_ATTEMPTS_PAGE}.",
                    {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": MAX_ATTEMPTS_PAGE,
                        "default": MAX_ATTEMPTS_PAGE,
                    },
                ),
                query(
                    "after",
                    "The last attempt id of the previous page (`<batch id>.<n>`); an id of"
                    " another batch or a malformed one is 400.",
                    {
                        "type": "string",
                        "pattern": rf"^[0-9a-f]{{32}}\.[0-9]{{1,{ATTEMPT_DIGITS}}}$",
                    },
                ),
                endpoint,
            ],
        ),
        "post": operation(
            "redeliverWebhook",
            "Redeliver the completion webhook now",
            {"202": json(outcomes.WebhookRedelivery, "The delivery is due now.")},
            ("NoWebhookUrl", "RedeliveryConflict", 404),
            description="The notifier POSTs the completion summary within about a second: the"
            " same `webhook-id` (`msg_<batch id>`), a new `webhook-timestamp` and signature. A"
            " delivery that ended (however it went) becomes `retrying`: one more attempt"
            " (`redelivery: true`), never retried automatically. A `retrying` delivery (an"
            " automatic retry waiting, or a redelivery asked for already) is only made due"
            " now, keeping its retries. A batch whose delivery has not started (none yet, or"
            ' deferred and unclaimed) gets its ordinary first delivery (`status: "sending"`,'
            " `redelivery: false`); asking again while it waits answers 202 again, still one"
            " POST. The answer's `status` and `next_attempt_at` are the stored ones that `GET`"
            " shows. With `endpoint_id`, the event the batch sent that webhook endpoint is"
            " redelivered the same way (same `webhook-id` and body).",
            parameters=[endpoint],
        ),
    }


def webhook_endpoints_paths() -> dict[str, Any]:
    """``/v1/webhook_endpoints``: create, list, delete (the same as under ``/openai/v1``)."""
    endpoint_id = {
        "name": "id",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": endpoints.ENDPOINT_ID},
    }
    return {
        "/v1/webhook_endpoints": {
            "post": operation(
                "createWebhookEndpoint",
                endpoints.SUMMARIES["create"],
                {"201": json(endpoints.WebhookEndpoint, "Created, with its secret.")},
                BODY_ERRORS,
                tag="webhooks",
                description=endpoints.CREATE_DESCRIPTION,
                requestBody={
                    "required": True,
                    "content": {
                        "application/json": {"schema": schema(endpoints.CreateWebhookEndpoint)}
                    },
                },
            ),
            "get": operation(
                "listWebhookEndpoints",
                endpoints.SUMMARIES["list"],
                {"200": json(endpoints.WebhookEndpointList, "Every endpoint, oldest first.")},
                tag="webhooks",
            ),
        },
        "/v1/webhook_endpoints/{id}": {
            "parameters": [endpoint_id],
            "delete": operation(
                "deleteWebhookEndpoint",
                endpoints.SUMMARIES["delete"],
                {"200": json(endpoints.WebhookEndpointDeleted, "Deleted.")},
                (404,),
                tag="webhooks",
            ),
        },
    }
