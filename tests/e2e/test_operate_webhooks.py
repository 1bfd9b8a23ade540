"""The webhook delivery log, a redelivery and opt-in retries on real processes: a
receiver answering 500 shows in the log and a redelivery (refused within 10 s of the
attempt's end) reaches it once more; a
workspace given 3 attempts (``relay workspaces webhook-retries``) gets its failing
receiver's webhook retried until it answers."""

from __future__ import annotations

import time
from typing import Any

import asyncpg
import orjson

from relay_batches.services.relay_cli import admin
from relay_batches.webhooks import verify
from tests.helpers.processes import System
from tests.helpers.receivers import Receiver, serving
from tests.helpers.support import ApiClient, past_redelivery_cooldown, rows, run_relay, wait_until

RETRY_WORKSPACE = "webhook-retries-e2e"


async def deliveries(api: ApiClient, batch_id: str, key: str | None = None) -> dict[str, Any]:
    """The batch's delivery log, insisting on 200."""
    status, body = await api.request("GET", f"/v1/batches/{batch_id}/webhook_deliveries", key=key)
    assert status == 200, body
    return body


async def settled_log(
    api: ApiClient, batch_id: str, attempts: int, key: str | None = None
) -> dict[str, Any]:
    """Wait until the log holds ``attempts`` attempts, none of them still posting, and
    the delivery is neither due nor under way."""

    async def settled() -> dict[str, Any] | None:
        log = await deliveries(api, batch_id, key)
        done = [a for a in log["data"] if a["status"] != "posting"]
        ready = len(done) == attempts and log["status"] in ("delivered", "failed", "refused")
        return log if ready else None

    return await wait_until(settled, 30, f"{attempts} settled attempts of {batch_id}", 0.1)


async def secret_of(system: System, workspace: str) -> str:
    conn = await asyncpg.connect(system.iso.database_url)
    try:
        return str(
            await conn.fetchval("SELECT webhook_secret FROM workspaces WHERE name = $1", workspace)
        )
    finally:
        await conn.close()


def attempt_view(log: dict[str, Any]) -> list[tuple[int, str, int | None, bool]]:
    return [(a["attempt"], a["status"], a["response_status"], a["redelivery"]) for a in log["data"]]


async def test_a_500_is_logged_and_a_redelivery_reaches_the_receiver_once_more(
    api: ApiClient, system: System
) -> None:
    async with serving(Receiver(answers=[500])) as receiver:
        created = await api.submit(
            {"model": "gpt-4o-mini", "requests": rows(2), "webhookUrl": receiver.url}
        )
        batch_id = created["id"]
        await api.wait_status(batch_id, {"completed"}, 30)
        log = await settled_log(api, batch_id, 1)
        assert attempt_view(log) == [(1, "failed", 500, False)]
        assert (log["status"], log["next_attempt_at"], log["has_more"]) == ("failed", None, False)
        [first] = log["data"]
        assert first["id"] == f"{batch_id}.1" and first["object"] == "webhook_delivery"
        assert first["error"] is None and first["duration_ms"] >= 0
        assert len(receiver.ids) == 1

        # A new second, so the redelivery's timestamp (and signature) differ.
        sent_at = int(receiver.headers[0]["webhook-timestamp"])

        async def next_second() -> bool:
            return int(time.time()) > sent_at

        await wait_until(next_second, 2, "the next second")
        path = f"/v1/batches/{batch_id}/webhook_deliveries"
        status, refused = await api.request("POST", path)
        assert (status, refused["error"]["param"]) == (409, "id"), refused
        assert "a redelivery may be asked for 10 s after it" in refused["error"]["message"]
        # Rather than wait out the 10 s:
        await past_redelivery_cooldown(system.iso.database_url, batch_id)
        asked = time.monotonic()
        status, scheduled = await api.request("POST", path)
        assert status == 202, scheduled
        assert scheduled["object"] == "webhook_delivery.scheduled"
        assert (scheduled["batch_id"], scheduled["status"]) == (batch_id, "retrying")

        async def redelivered() -> bool:
            return len(receiver.ids) == 2

        await wait_until(redelivered, 10, "the redelivery", 0.05)
        assert time.monotonic() - asked < 3, "a redelivery goes out within about a second"
        log = await settled_log(api, batch_id, 2)
        assert attempt_view(log) == [(1, "failed", 500, False), (2, "delivered", 204, True)]
        assert log["status"] == "delivered"
        assert receiver.ids == [f"msg_{batch_id}"] * 2
        first_headers, again = receiver.headers
        assert int(again["webhook-timestamp"]) > sent_at
        assert again["webhook-signature"] != first_headers["webhook-signature"]
        secret = await secret_of(system, "workspace-a")
        assert all(
            verify(secret, h, b) for h, b in zip(receiver.headers, receiver.bodies, strict=True)
        )
        assert orjson.loads(receiver.bodies[1]) == orjson.loads(receiver.bodies[0])
        assert orjson.loads(receiver.bodies[1])["id"] == batch_id


async def set_retries(system: System, workspace: str, attempts: int) -> str:
    """``relay workspaces webhook-retries`` as an operator runs it; its stdout."""
    args = ("workspaces", "webhook-retries", workspace, "--max-attempts", str(attempts))
    code, out, err = await run_relay(*args, env={**system.base_env}, timeout_s=30)
    assert code == 0, err.decode()
    return out.decode()


async def test_a_workspace_with_three_attempts_gets_its_failing_receiver_retried(
    api: ApiClient, system: System
) -> None:
    created_key = await admin.create_key(system.iso.database_url, RETRY_WORKSPACE)
    assert await set_retries(system, RETRY_WORKSPACE, 3) == (
        f"workspace {RETRY_WORKSPACE}: webhook max attempts 3"
        " (failed attempts retried with backoff, up to 24 h)\n"
    )
    key = created_key.key
    async with serving(Receiver(answers=[500, 500])) as receiver:
        created = await api.submit(
            {"model": "gpt-4o-mini", "requests": rows(2), "webhookUrl": receiver.url}, key=key
        )
        batch_id = created["id"]
        log = await settled_log(api, batch_id, 3, key)
        assert attempt_view(log) == [
            (1, "failed", 500, False),
            (2, "failed", 500, False),
            (3, "delivered", 204, False),
        ]
        assert log["status"] == "delivered"
        assert receiver.ids == [f"msg_{batch_id}"] * 3
        secret = await secret_of(system, RETRY_WORKSPACE)
        assert all(
            verify(secret, h, b) for h, b in zip(receiver.headers, receiver.bodies, strict=True)
        )
        # The log belongs to the batch's workspace: workspace A's key gets 404.
        status, _ = await api.request("GET", f"/v1/batches/{batch_id}/webhook_deliveries")
        assert status == 404
