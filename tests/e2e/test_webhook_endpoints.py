"""A workspace's webhook endpoints on real processes, checked as a user of the official
SDKs would: every batch of the workspace that ends, whichever surface created it, sends
a signed OpenAI event that ``OpenAI(webhook_secret=…).webhooks.unwrap()`` reads as its
typed event with the batch's id as that surface shows it; an endpoint's ``events``
filter is respected, a deleted endpoint is sent nothing, and a URL the webhook guard
refuses is a 400 naming ``url`` on each surface."""

from __future__ import annotations

import base64
from typing import Any

import aiohttp
import openai
import orjson
from openai.types import Batch
from openai.types.webhooks import (
    BatchCancelledWebhookEvent,
    BatchCompletedWebhookEvent,
    BatchExpiredWebhookEvent,
    BatchFailedWebhookEvent,
    UnwrapWebhookEvent,
)

from relay_batches.services.relay_cli import admin
from tests.helpers.anthropic_sdk import params, sdk_client
from tests.helpers.processes import System
from tests.helpers.receivers import Receiver, serving
from tests.helpers.support import ApiClient, past_redelivery_cooldown, rows, wait_until

MODEL = "gpt-4o-mini"
ALL_EVENTS = ["batch.completed", "batch.failed", "batch.cancelled", "batch.expired"]


def jsonl_line(custom_id: str, text: str) -> bytes:
    """One OpenAI batch input line."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    item = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
    return orjson.dumps(item) + b"\n"


async def workspace(system: System, name: str) -> str:
    """A key of a workspace of the test's own (its endpoints see only its batches)."""
    return (await admin.create_key(system.iso.database_url, name)).key


async def call(
    http: aiohttp.ClientSession, system: System, key: str, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    """``(status, JSON)`` of one request to the API."""
    headers = {"Authorization": f"Bearer {key}"}
    async with http.request(method, system.api_url + path, json=body, headers=headers) as reply:
        return reply.status, orjson.loads(await reply.read())


async def new_endpoint(
    http: aiohttp.ClientSession, system: System, key: str, body: dict[str, Any], surface: str
) -> dict[str, Any]:
    """Create an endpoint on ``surface`` (``/v1`` or ``/openai/v1``), insisting on 201."""
    status, created = await call(http, system, key, "POST", f"{surface}/webhook_endpoints", body)
    assert status == 201, created
    return dict(created)


def openai_client(system: System, key: str) -> openai.AsyncOpenAI:
    """The SDK as a user sets it up for Relay (close it: ``async with``)."""
    return openai.AsyncOpenAI(base_url=f"{system.api_url}/openai/v1", api_key=key, max_retries=0)


async def openai_batch(system: System, key: str, data: bytes) -> Batch:
    """A batch of the JSONL ``data``, created through the SDK's documented workflow."""
    async with openai_client(system, key) as client:
        uploaded = await client.files.create(file=("hooks.jsonl", data), purpose="batch")
        return await client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )


def unwrapped(receiver: Receiver, secret: str) -> list[UnwrapWebhookEvent]:
    """Every POST the receiver got, verified and read by the SDK."""
    client = openai.OpenAI(api_key="unused", webhook_secret=secret)
    return [
        client.webhooks.unwrap(body, headers)
        for body, headers in zip(receiver.bodies, receiver.headers, strict=True)
    ]


async def received(receiver: Receiver, count: int) -> None:
    """Wait until the receiver has had ``count`` POSTs."""

    async def enough() -> bool:
        return len(receiver.bodies) >= count

    await wait_until(enough, 60, f"{count} webhook events", 0.1)


async def test_sdk_native_and_anthropic_batches_each_send_a_typed_batch_completed(
    system: System, http: aiohttp.ClientSession
) -> None:
    key = await workspace(system, "endpoints-three-surfaces")
    async with serving(Receiver()) as receiver:
        created = await new_endpoint(http, system, key, {"url": receiver.url}, "/openai/v1")
        assert created["id"].startswith("we_") and created["object"] == "webhook_endpoint"
        assert (created["url"], created["events"]) == (receiver.url, ALL_EVENTS)
        secret = created["secret"]
        assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) == 32
        for surface in ("/v1", "/openai/v1"):
            status, listed = await call(http, system, key, "GET", f"{surface}/webhook_endpoints")
            assert status == 200 and listed["object"] == "list", listed
            assert [e["id"] for e in listed["data"]] == [created["id"]]
            assert "secret" not in listed["data"][0]

        sdk_batch = await openai_batch(system, key, jsonl_line("a", "one") + jsonl_line("b", "2"))
        api = ApiClient(system.api_url, key, http)
        native = await api.submit({"model": MODEL, "requests": rows(2)})
        async with sdk_client(system.api_url, key) as anthropic_client:
            anthropic = await anthropic_client.messages.batches.create(
                requests=[{"custom_id": "c", "params": params("three")}]  # type: ignore[list-item]
            )
        await received(receiver, 3)

    events = unwrapped(receiver, secret)
    assert all(isinstance(e, BatchCompletedWebhookEvent) for e in events), events
    assert sorted(e.data.id for e in events) == sorted([sdk_batch.id, native["id"], anthropic.id])
    assert sdk_batch.id.startswith("batch_") and anthropic.id.startswith("msgbatch_")
    # The event id is the webhook-id; each event is its own.
    assert [e.id for e in events] == [h["webhook-id"] for h in receiver.headers]
    assert len({e.id for e in events}) == 3 and all(e.id.startswith("evt_") for e in events)
    async with openai_client(system, key) as client:
        done = await client.batches.retrieve(sdk_batch.id)
    assert done.status == "completed"
    assert any(e.created_at == done.completed_at for e in events if e.data.id == sdk_batch.id)


async def test_a_failed_batch_sends_batch_failed_and_the_events_filter_is_respected(
    system: System, http: aiohttp.ClientSession
) -> None:
    key = await workspace(system, "endpoints-filter")
    async with serving(Receiver()) as failures, serving(Receiver()) as every:
        only_failed = await new_endpoint(
            http, system, key, {"url": failures.url, "events": ["batch.failed"]}, "/v1"
        )
        assert only_failed["events"] == ["batch.failed"]
        all_events = await new_endpoint(http, system, key, {"url": every.url}, "/v1")

        failed = await openai_batch(system, key, jsonl_line("a", "fine") + b"{not json\n")
        assert failed.status == "failed"
        await received(every, 1)  # the failed batch first: only then a completed one
        api = ApiClient(system.api_url, key, http)
        completed = await api.submit({"model": MODEL, "requests": rows(1)})
        await received(every, 2)

    [only] = unwrapped(failures, only_failed["secret"])
    assert isinstance(only, BatchFailedWebhookEvent) and only.data.id == failed.id
    first, second = unwrapped(every, all_events["secret"])
    assert isinstance(first, BatchFailedWebhookEvent) and first.data.id == failed.id
    assert isinstance(second, BatchCompletedWebhookEvent) and second.data.id == completed["id"]
    # Each endpoint signs with its own secret: one's event does not verify with the other's.
    mixed = openai.OpenAI(api_key="unused", webhook_secret=all_events["secret"])
    try:
        mixed.webhooks.unwrap(failures.bodies[0], failures.headers[0])
    except openai.InvalidWebhookSignatureError:
        pass
    else:
        raise AssertionError("an endpoint's event verified with another endpoint's secret")


async def test_a_deleted_endpoint_is_sent_nothing(
    system: System, http: aiohttp.ClientSession
) -> None:
    key = await workspace(system, "endpoints-delete")
    async with serving(Receiver()) as gone, serving(Receiver()) as kept:
        deleted = await new_endpoint(http, system, key, {"url": gone.url}, "/v1")
        await new_endpoint(http, system, key, {"url": kept.url}, "/openai/v1")
        path = f"/openai/v1/webhook_endpoints/{deleted['id']}"
        status, answer = await call(http, system, key, "DELETE", path)
        assert (status, answer) == (
            200,
            {"id": deleted["id"], "object": "webhook_endpoint", "deleted": True},
        )
        status, again = await call(
            http, system, key, "DELETE", f"/v1/webhook_endpoints/{deleted['id']}"
        )
        assert status == 404 and again["error"]["param"] == "id", again
        status, listed = await call(http, system, key, "GET", "/v1/webhook_endpoints")
        assert deleted["id"] not in [e["id"] for e in listed["data"]]

        api = ApiClient(system.api_url, key, http)
        batch = await api.submit({"model": MODEL, "requests": rows(1)})
        await received(kept, 1)
        await api.wait_status(batch["id"], {"completed"}, 30)
    assert gone.bodies == []


async def test_another_workspace_cannot_see_or_delete_an_endpoint(
    system: System, http: aiohttp.ClientSession
) -> None:
    owner = await workspace(system, "endpoints-owner")
    other = await workspace(system, "endpoints-other")
    created = await new_endpoint(http, system, owner, {"url": "http://127.0.0.1:9/hook"}, "/v1")
    status, listed = await call(http, system, other, "GET", "/v1/webhook_endpoints")
    assert (status, listed["data"]) == (200, [])
    path = f"/v1/webhook_endpoints/{created['id']}"
    status, _ = await call(http, system, other, "DELETE", path)
    assert status == 404
    status, _ = await call(http, system, owner, "DELETE", path)
    assert status == 200


async def test_a_refused_url_and_bad_fields_are_400s_naming_the_field(
    system: System, http: aiohttp.ClientSession
) -> None:
    key = await workspace(system, "endpoints-refused")
    for url in ("http://169.254.169.254/latest/meta-data", "http://10.0.0.8/hook"):
        status, native = await call(
            http, system, key, "POST", "/v1/webhook_endpoints", {"url": url}
        )
        assert status == 400 and native["error"]["param"] == "url", native
        assert "refused" in native["error"]["message"]
        status, shaped = await call(
            http, system, key, "POST", "/openai/v1/webhook_endpoints", {"url": url}
        )
        assert status == 400, shaped
        error = shaped["error"]
        assert (error["param"], error["type"]) == ("url", "invalid_request_error"), error
    cases = [
        ({"url": "ftp://example.com/x"}, "url"),
        ({}, "url"),
        ({"url": "http://127.0.0.1:9/h", "events": ["batch.done"]}, "events[0]"),
        ({"url": "http://127.0.0.1:9/h", "events": []}, "events"),
        ({"url": "http://127.0.0.1:9/h", "secret": "mine"}, "secret"),
    ]
    for body, param in cases:
        status, answer = await call(http, system, key, "POST", "/v1/webhook_endpoints", body)
        assert (status, answer["error"]["param"]) == (400, param), (body, answer)
    status, listed = await call(http, system, key, "GET", "/v1/webhook_endpoints")
    assert listed["data"] == []


async def test_an_endpoints_event_is_in_the_log_and_redelivered_with_the_same_id(
    system: System, http: aiohttp.ClientSession
) -> None:
    key = await workspace(system, "endpoints-redelivery")
    async with serving(Receiver()) as receiver:
        endpoint = await new_endpoint(http, system, key, {"url": receiver.url}, "/v1")
        api = ApiClient(system.api_url, key, http)
        batch = await api.submit({"model": MODEL, "requests": rows(1)})
        await received(receiver, 1)
        path = f"/v1/batches/{batch['id']}/webhook_deliveries?endpoint_id={endpoint['id']}"

        async def logged() -> dict[str, Any] | None:
            status, log = await call(http, system, key, "GET", path)
            assert status == 200, log
            return log if log["status"] == "delivered" else None

        log = await wait_until(logged, 30, "the endpoint's delivery logged", 0.1)
        assert log["endpoint_id"] == endpoint["id"]
        assert [(a["attempt"], a["status"], a["response_status"]) for a in log["data"]] == [
            (1, "delivered", 204)
        ]
        status, own = await call(
            http, system, key, "GET", f"/v1/batches/{batch['id']}/webhook_deliveries"
        )
        assert (status, own["status"], own["data"]) == (200, None, [])  # no webhookUrl

        await past_redelivery_cooldown(system.iso.database_url, batch["id"])
        status, scheduled = await call(http, system, key, "POST", path)
        assert status == 202 and scheduled["status"] == "retrying", scheduled
        await received(receiver, 2)
        status, bad = await call(
            http, system, key, "GET", f"/v1/batches/{batch['id']}/webhook_deliveries?endpoint_id=x"
        )
        assert status == 400 and bad["error"]["param"] == "endpoint_id", bad

    first, again = unwrapped(receiver, endpoint["secret"])
    assert receiver.bodies[0] == receiver.bodies[1] and first.id == again.id
    assert receiver.headers[0]["webhook-id"] == receiver.headers[1]["webhook-id"]
    assert isinstance(again, BatchCompletedWebhookEvent) and again.data.id == batch["id"]


async def test_a_cancelled_and_an_expired_batch_send_their_typed_events(
    system: System, http: aiohttp.ClientSession
) -> None:
    key = await workspace(system, "endpoints-cancel-expire")
    slow = [params(f"slow {i} [sim:delay-ms=2000]") for i in range(40)]
    async with serving(Receiver()) as receiver:
        endpoint = await new_endpoint(
            http,
            system,
            key,
            {"url": receiver.url, "events": ["batch.cancelled", "batch.expired"]},
            "/openai/v1",
        )
        async with sdk_client(system.api_url, key) as anthropic_client:
            created = await anthropic_client.messages.batches.create(
                requests=[{"custom_id": f"s{i}", "params": p} for i, p in enumerate(slow)]  # type: ignore[misc]
            )
            await anthropic_client.messages.batches.cancel(created.id)
        api = ApiClient(system.api_url, key, http)
        expiring = await api.submit(
            {
                "model": MODEL,
                "requests": rows(40, "slow {i} [sim:delay-ms=2000]"),
                "completion_window": "1s",
            }
        )
        await received(receiver, 2)

    by_type = {type(e): e for e in unwrapped(receiver, endpoint["secret"])}
    assert set(by_type) == {BatchCancelledWebhookEvent, BatchExpiredWebhookEvent}, by_type
    assert by_type[BatchCancelledWebhookEvent].data.id == created.id
    assert created.id.startswith("msgbatch_")
    assert by_type[BatchExpiredWebhookEvent].data.id == expiring["id"]
