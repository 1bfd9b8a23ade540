"""A webhook endpoint's events as a user's receiver reads them: the OpenAI event shape,
signed per Standard Webhooks so the official SDK's ``webhooks.unwrap()`` verifies it
and returns the typed event of each way a batch ends; the batch id as each surface
shows it; the ``events`` field's validation and the URL guard applied at creation."""

from __future__ import annotations

import asyncio
import base64
import socket
import time
from datetime import UTC, datetime

import openai
import pytest
from openai.types.webhooks import (
    BatchCancelledWebhookEvent,
    BatchCompletedWebhookEvent,
    BatchExpiredWebhookEvent,
    BatchFailedWebhookEvent,
)

from relay_batches.errors import ApiError
from relay_batches.ledger.keys import generate_webhook_secret
from relay_batches.ledger.webhook_endpoints import Endpoint, endpoint_hex
from relay_batches.model import JobStatus
from relay_batches.netguard import UrlGuard, parse_networks
from relay_batches.services.ingest_api.webhook_endpoints import parse_events
from relay_batches.webhooks import (
    ALL_EVENTS,
    EVENT_TYPES,
    batch_event,
    shown_batch_id,
    signed_headers,
)

HEX = "0123456789abcdef0123456789abcdef"
TYPED = {
    JobStatus.COMPLETED: BatchCompletedWebhookEvent,
    JobStatus.FAILED: BatchFailedWebhookEvent,
    JobStatus.CANCELED: BatchCancelledWebhookEvent,
    JobStatus.EXPIRED: BatchExpiredWebhookEvent,
}


@pytest.mark.parametrize("status", list(TYPED))
def test_each_end_unwraps_as_its_typed_sdk_event(status: JobStatus) -> None:
    secret = generate_webhook_secret()
    body = batch_event("evt_" + HEX, EVENT_TYPES[status], 1_790_000_000, "batch_" + HEX)
    headers = signed_headers(secret, "evt_" + HEX, body)

    event = openai.OpenAI(api_key="unused", webhook_secret=secret).webhooks.unwrap(body, headers)

    assert type(event) is TYPED[status]
    assert (event.id, event.object, event.created_at) == ("evt_" + HEX, "event", 1_790_000_000)
    assert event.data.id == "batch_" + HEX


def test_only_the_ends_of_a_batch_are_events() -> None:
    assert set(EVENT_TYPES) == {s for s in JobStatus if s in TYPED}
    assert ALL_EVENTS == ("batch.completed", "batch.failed", "batch.cancelled", "batch.expired")


def test_an_event_signed_with_another_secret_or_altered_is_refused() -> None:
    secret = generate_webhook_secret()
    body = batch_event("evt_1", "batch.completed", int(time.time()), HEX)
    headers = signed_headers(secret, "evt_1", body)
    sdk = openai.OpenAI(api_key="unused", webhook_secret=generate_webhook_secret()).webhooks
    with pytest.raises(openai.InvalidWebhookSignatureError):
        sdk.unwrap(body, headers)
    own = openai.OpenAI(api_key="unused", webhook_secret=secret).webhooks
    with pytest.raises(openai.InvalidWebhookSignatureError):
        own.unwrap(body.replace(HEX.encode(), b"f" * 32), headers)


def test_the_secret_is_standard_webhooks_whsec_of_32_random_bytes() -> None:
    first, second = generate_webhook_secret(), generate_webhook_secret()
    assert first.startswith("whsec_") and first != second
    assert len(base64.b64decode(first.removeprefix("whsec_"))) == 32


def test_the_batch_id_is_shown_as_the_creating_surface_shows_it() -> None:
    assert shown_batch_id(HEX, "openai") == "batch_" + HEX
    assert shown_batch_id(HEX, "anthropic") == "msgbatch_" + HEX
    assert shown_batch_id(HEX, None) == HEX


def test_the_secret_is_shown_only_when_given_and_ids_carry_their_prefix() -> None:
    created_at = datetime(2026, 12, 7, tzinfo=UTC)
    endpoint = Endpoint(HEX, "https://example.com/h", ("batch.failed",), created_at)
    shown = endpoint.to_api()
    assert shown == {
        "id": "we_" + HEX,
        "object": "webhook_endpoint",
        "url": "https://example.com/h",
        "events": ["batch.failed"],
        "created_at": int(created_at.timestamp()),
    }
    with_secret = Endpoint(HEX, "https://example.com/h", ALL_EVENTS, created_at, "whsec_x")
    assert with_secret.to_api()["secret"] == "whsec_x"
    assert endpoint_hex("we_" + HEX) == HEX
    assert endpoint_hex(HEX) is None and endpoint_hex("we_" + HEX[:-1]) is None


def test_events_default_to_all_and_bad_ones_name_their_index() -> None:
    assert parse_events(None) == ALL_EVENTS
    assert parse_events(["batch.expired", "batch.failed"]) == ("batch.expired", "batch.failed")
    cases: list[tuple[object, str]] = [
        ([], "events"),
        ("batch.failed", "events"),
        (["batch.failed", "batch.done"], "events[1]"),
        (["batch.failed", "batch.failed"], "events[1]"),
        ([3], "events[0]"),
    ]
    for value, param in cases:
        with pytest.raises(ApiError) as caught:
            parse_events(value)
        assert (caught.value.status, caught.value.param) == (400, param)


async def test_the_url_guard_refuses_what_the_notifier_would() -> None:
    addresses = {"public.example": "93.184.216.34", "inside.example": "10.1.2.3"}

    async def lookup(host: str, port: int) -> list[tuple[int, str]]:
        if host not in addresses:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, addresses[host])]

    guard = UrlGuard((), 1.0, lookup)
    assert await guard.refusal("https://public.example/hook") is None
    inside = await guard.refusal("https://inside.example/hook")
    assert inside is not None and "private" in inside
    metadata = await guard.refusal("http://169.254.169.254/latest")
    assert metadata is not None and "metadata" in metadata
    unknown = await guard.refusal("https://nowhere.example/hook")
    assert unknown is not None and "cannot resolve" in unknown
    allowed = UrlGuard(parse_networks("10.0.0.0/8"), 1.0, lookup)
    assert await allowed.refusal("https://inside.example/hook") is None


async def test_a_host_that_resolves_too_slowly_is_refused_within_the_deadline() -> None:
    async def stuck(host: str, port: int) -> list[tuple[int, str]]:
        await asyncio.sleep(5)
        return []

    started = time.monotonic()
    reason = await UrlGuard((), 0.05, stuck).refusal("https://slow.example/hook")
    assert reason is not None and "longer than" in reason
    assert time.monotonic() - started < 1
