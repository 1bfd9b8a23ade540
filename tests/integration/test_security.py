"""Keys, idempotency and webhook delivery against the real ledger (and loopback only)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
from collections.abc import AsyncIterator

import asyncpg
import orjson
import pytest
from aiohttp import web

from relay_batches.ids import new_id
from relay_batches.ledger import keys as keys_module
from relay_batches.ledger.deliveries import DeliveryStore
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.messages import JobEvent
from relay_batches.netguard import parse_networks
from relay_batches.services.notifier.core import deliver_webhook
from relay_batches.services.notifier.http import guarded_poster
from relay_batches.services.relay_cli import admin
from tests.helpers.support import ApiClient, Isolation, WebhookReceiver, relay_admin, rows


async def test_key_lifecycle_create_use_list_revoke(iso: Isolation, client_a: ApiClient) -> None:
    created = await relay_admin(iso, "keys", "create", "--workspace", "lifecycle")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip().splitlines()[-1]
    assert key.startswith("rk_") and len(key) == 35

    status, _ = await client_a.request("GET", "/v1/batches", key=key)
    assert status == 200

    listed = await relay_admin(iso, "keys", "list", "--workspace", "lifecycle")
    assert listed.returncode == 0
    [line] = listed.stdout.strip().splitlines()
    key_id = line.split()[0]
    assert key[:8] in line and key not in line and "active" in line

    revoked = await relay_admin(iso, "keys", "revoke", key_id)
    assert revoked.returncode == 0, revoked.stderr
    status, body = await client_a.request("GET", "/v1/batches", key=key)
    assert (status, body["error"]["type"]) == (401, "authentication_error")

    again = await relay_admin(iso, "keys", "revoke", key_id)
    assert again.returncode != 0
    assert "no active key" in again.stderr


async def test_keys_are_compared_in_constant_time(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = KeyStore(pool)
    created = await store.create_key(await store.ensure_workspace("ct"))
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(keys_module.hmac, "compare_digest", spy)
    assert await store.workspace_for_key(created.key) is not None
    # A last character that differs from the real one: "A" alone would match 1 key in 64.
    wrong = created.key[:-1] + ("B" if created.key.endswith("A") else "A")
    assert await store.workspace_for_key(wrong) is None
    assert compared
    assert all(len(a) == len(b) == 32 for a, b in compared)


async def test_workspace_commands(iso: Isolation) -> None:
    made = await relay_admin(iso, "workspaces", "create", "acme")
    assert made.returncode == 0
    listed = await relay_admin(iso, "workspaces", "list")
    assert " acme " in listed.stdout
    first = await relay_admin(iso, "workspaces", "webhook-secret", "acme")
    second = await relay_admin(iso, "workspaces", "webhook-secret", "acme")
    secrets = [first.stdout.strip().splitlines()[-1], second.stdout.strip().splitlines()[-1]]
    assert all(s.startswith("whsec_") for s in secrets)
    assert secrets[0] != secrets[1]
    missing = await relay_admin(iso, "workspaces", "webhook-secret", "nope")
    assert missing.returncode != 0 and "no workspace" in missing.stderr


async def test_idempotency_key_replays_the_first_response(client_a: ApiClient) -> None:
    body = {"model": "gpt-4o-mini", "requests": rows(3)}
    headers = {"Idempotency-Key": f"order-{new_id()}"}
    s1, first = await client_a.request("POST", "/v1/batches", json=body, headers=headers)
    s2, second = await client_a.request("POST", "/v1/batches", json=body, headers=headers)
    assert (s1, s2) == (201, 201)
    assert second == first
    _, listing = await client_a.request("GET", "/v1/batches?limit=100")
    assert sum(1 for b in listing["data"] if b["id"] == first["id"]) == 1

    other = {"model": "gpt-4o-mini", "requests": rows(4)}
    s3, conflict = await client_a.request("POST", "/v1/batches", json=other, headers=headers)
    assert (s3, conflict["error"]["type"]) == (409, "conflict_error")
    assert conflict["error"]["param"] == "Idempotency-Key"


async def test_concurrent_requests_with_one_key_create_one_batch(
    client_a: ApiClient, pool: asyncpg.Pool
) -> None:
    body = {"model": "gpt-4o-mini", "name": f"race-{new_id()}", "requests": rows(2)}
    headers = {"Idempotency-Key": f"race-{new_id()}"}
    answers = await asyncio.gather(
        *(client_a.request("POST", "/v1/batches", json=body, headers=headers) for _ in range(5))
    )
    assert {status for status, _ in answers} == {201}
    assert len({data["id"] for _, data in answers}) == 1
    count = await pool.fetchval("SELECT count(*) FROM batches WHERE name = $1", body["name"])
    assert count == 1


async def test_the_same_key_in_another_workspace_is_independent(
    client_a: ApiClient, client_b: ApiClient
) -> None:
    body = {"model": "gpt-4o-mini", "requests": rows(1)}
    headers = {"Idempotency-Key": f"shared-{new_id()}"}
    _, a = await client_a.request("POST", "/v1/batches", json=body, headers=headers)
    _, b = await client_b.request("POST", "/v1/batches", json=body, headers=headers)
    assert a["id"] != b["id"]


async def test_a_bad_idempotency_key_is_400(client_a: ApiClient) -> None:
    body = {"model": "gpt-4o-mini", "requests": rows(1)}
    status, data = await client_a.request(
        "POST", "/v1/batches", json=body, headers={"Idempotency-Key": "x" * 256}
    )
    assert (status, data["error"]["param"]) == (400, "Idempotency-Key")


# --- webhook delivery: the SSRF guard on the real path, loopback targets only ---------


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    """A local receiver."""
    created = WebhookReceiver()
    await created.start()
    yield created
    await created.stop()


async def _finished_batch(pool: asyncpg.Pool, url: str) -> tuple[str, str]:
    store = KeyStore(pool)
    workspace_id = await store.ensure_workspace(f"hooks-{new_id()[:6]}")
    batch = await JobStore(pool).create(
        NewJob(new_id(), workspace_id, "hooked", "gpt-4o-mini", 0, 1, url, None, None),
        [("c-0", "[]")],
    )
    await pool.execute(
        "UPDATE batches SET status = 'canceled', completed_at = now() WHERE id = $1", batch.id
    )
    return batch.id, workspace_id


async def _delivery(pool: asyncpg.Pool, batch_id: str) -> asyncpg.Record:
    return await pool.fetchrow(
        "SELECT status, status_code, error, message_id FROM webhook_deliveries WHERE batch_id = $1",
        batch_id,
    )


def readme_verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """The verification recipe docs/guides/webhooks.md documents, verbatim in spirit."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(hmac.compare_digest(expected, sig) for sig in headers["webhook-signature"].split())


async def test_localhost_is_refused_by_default_and_recorded(
    pool: asyncpg.Pool, receiver: WebhookReceiver
) -> None:
    url = f"http://localhost:{receiver.port}/hook"
    batch_id, _ = await _finished_batch(pool, url)
    event = JobEvent(batch_id, "canceled", 1, 0, 0)
    outcome = await deliver_webhook(event, DeliveryStore(pool), guarded_poster((), 5))
    assert outcome == "refused"
    assert receiver.bodies == []
    record = await _delivery(pool, batch_id)
    assert record["status"] == "refused"
    assert record["status_code"] is None
    assert "localhost resolves to" in record["error"] and "loopback" in record["error"]


async def test_an_ip_literal_loopback_url_is_refused_too(
    pool: asyncpg.Pool, receiver: WebhookReceiver
) -> None:
    batch_id, _ = await _finished_batch(pool, receiver.url)
    event = JobEvent(batch_id, "canceled", 1, 0, 0)
    assert await deliver_webhook(event, DeliveryStore(pool), guarded_poster((), 5)) == "refused"
    assert receiver.bodies == []


async def test_the_allow_list_opens_loopback_and_the_signature_verifies(
    pool: asyncpg.Pool, receiver: WebhookReceiver
) -> None:
    url = f"http://localhost:{receiver.port}/hook"
    batch_id, workspace_id = await _finished_batch(pool, url)
    allow = parse_networks("127.0.0.0/8,::1/128")
    event = JobEvent(batch_id, "canceled", 1, 0, 0)
    outcome = await deliver_webhook(event, DeliveryStore(pool), guarded_poster(allow, 5))
    assert outcome == "delivered"
    assert (await _delivery(pool, batch_id))["status"] == "delivered"
    [body] = receiver.bodies
    assert body["id"] == batch_id and body["status"] == "canceled"
    headers = {k.lower(): v for k, v in receiver.headers[0].items()}
    raw = orjson.dumps(body)
    secret = await pool.fetchval(
        "SELECT webhook_secret FROM workspaces WHERE id = $1", workspace_id
    )
    assert headers["webhook-id"] == f"msg_{batch_id}"
    assert readme_verify(secret, headers, raw)
    assert not readme_verify(secret, headers, raw.replace(b"canceled", b"completed"))
    tampered = {**headers, "webhook-timestamp": str(int(headers["webhook-timestamp"]) + 1)}
    assert not readme_verify(secret, tampered, raw)


async def test_redirects_are_not_followed(pool: asyncpg.Pool) -> None:
    hits: list[str] = []

    async def redirect(request: web.Request) -> web.Response:
        hits.append(request.path)
        raise web.HTTPFound("/elsewhere")

    app = web.Application()
    app.router.add_post("/hook", redirect)
    app.router.add_post("/elsewhere", redirect)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        batch_id, _ = await _finished_batch(pool, f"http://127.0.0.1:{port}/hook")
        allow = parse_networks("127.0.0.0/8")
        event = JobEvent(batch_id, "canceled", 1, 0, 0)
        assert await deliver_webhook(event, DeliveryStore(pool), guarded_poster(allow, 5)) == (
            "failed"
        )
    finally:
        await runner.cleanup()
    assert hits == ["/hook"]
    assert (await _delivery(pool, batch_id))["status_code"] == 302


async def test_admin_create_key_is_usable(iso: Isolation, client_a: ApiClient) -> None:
    created = await admin.create_key(iso.database_url, "admin-made")
    status, _ = await client_a.request("GET", "/v1/batches", key=created.key)
    assert status == 200
