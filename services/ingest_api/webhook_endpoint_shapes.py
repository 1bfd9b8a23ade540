"""The webhook endpoint objects as pydantic models, from which their OpenAPI schemas are
generated (the native and OpenAI surfaces serve the same objects, each documenting them
with its own error object), and the OpenAI event an endpoint is sent."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from relay_batches.ledger.webhook_endpoints import MAX_ENDPOINTS
from relay_batches.services.ingest_api.rows.job_fields import MAX_WEBHOOK_URL_CHARS

EventType = Literal["batch.completed", "batch.failed", "batch.cancelled", "batch.expired"]
ENDPOINT_ID = r"^we_[0-9a-f]{32}$"


class CreateWebhookEndpoint(BaseModel):
    """`POST /webhook_endpoints`: where to send the workspace's batch events, and which."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        max_length=MAX_WEBHOOK_URL_CHARS,
        description="An absolute http(s) URL; refused (400 naming `url`) when its host"
        " resolves to an address the webhook guard refuses (private, loopback, link-local,"
        " metadata…; see RELAY_WEBHOOK_ALLOW_NETWORKS).",
    )
    events: list[EventType] | None = Field(
        default=None,
        min_length=1,
        description="The event types to send (distinct); absent or null: all four.",
    )


class WebhookEndpoint(BaseModel):
    """A webhook endpoint; `secret` (`whsec_…`, Standard Webhooks) only when created."""

    id: str = Field(pattern=ENDPOINT_ID)
    object: Literal["webhook_endpoint"]
    url: str
    events: list[EventType]
    created_at: int = Field(description="Unix seconds.")
    secret: str | None = Field(
        default=None,
        pattern=r"^whsec_[A-Za-z0-9+/=]+$",
        description="Only in the answer to the POST that created it: keep it to verify"
        " signatures (`OpenAI(webhook_secret=…).webhooks.unwrap()`).",
    )


class WebhookEndpointList(BaseModel):
    """`GET /webhook_endpoints`: every endpoint of the workspace, oldest first."""

    object: Literal["list"]
    data: list[WebhookEndpoint] = Field(max_length=MAX_ENDPOINTS)
    first_id: str | None
    last_id: str | None
    has_more: Literal[False]


class WebhookEndpointDeleted(BaseModel):
    """`DELETE /webhook_endpoints/{id}`."""

    id: str = Field(pattern=ENDPOINT_ID)
    object: Literal["webhook_endpoint"]
    deleted: Literal[True]


MODELS: tuple[type[BaseModel], ...] = (
    WebhookEndpoint,
    WebhookEndpointList,
    WebhookEndpointDeleted,
)

SUMMARIES: dict[str, str] = {
    "create": "Create a webhook endpoint: every batch of the workspace that ends sends it"
    " an OpenAI event (batch.completed, batch.failed, batch.cancelled, batch.expired)",
    "list": "List the workspace's webhook endpoints (no secrets)",
    "delete": "Delete a webhook endpoint: it is sent nothing more",
}
CREATE_DESCRIPTION = (
    f"At most {MAX_ENDPOINTS} per workspace (409 beyond). The answer carries the endpoint's"
    " `whsec_` secret, never shown again. Each event is signed per Standard Webhooks with it"
    " (`webhook-id`, `webhook-timestamp`, `webhook-signature`)."
)
