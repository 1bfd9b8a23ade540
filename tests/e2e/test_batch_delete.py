"""``DELETE /v1/batches/{id}`` on real processes: a job that ran through every service and
delivered its webhook goes, with its rows, outcomes, delivery and delivery log; then the
native, OpenAI and Anthropic surfaces all answer 404 for it."""

from __future__ import annotations

import asyncpg

from tests.helpers.processes import System
from tests.helpers.support import ApiClient, WebhookReceiver, rows, wait_until

TABLES = {
    "batches": "id",
    "batch_rows": "batch_id",
    "row_results": "batch_id",
    "webhook_deliveries": "batch_id",
    "webhook_attempts": "batch_id",
}


async def stored(system: System, batch_id: str) -> dict[str, int]:
    """How many rows of each table name ``batch_id``."""
    conn = await asyncpg.connect(system.iso.database_url)
    try:
        return {
            table: await conn.fetchval(
                f"SELECT count(*) FROM {table} WHERE {column} = $1", batch_id
            )
            for table, column in TABLES.items()
        }
    finally:
        await conn.close()


async def test_a_delivered_job_is_deleted_and_every_surface_answers_404(
    system: System, api: ApiClient, webhooks: WebhookReceiver
) -> None:
    job = await api.submit(
        {"model": "gpt-4o-mini", "requests": rows(3), "webhookUrl": webhooks.url}
    )
    await api.wait_status(job["id"], {"completed"}, timeout=60)
    await wait_until(lambda: _some(webhooks.for_batch(job["id"])), 30, "the webhook")

    async def logged() -> bool:
        return (await stored(system, job["id"]))["webhook_attempts"] == 1

    await wait_until(logged, 30, "the delivery log's attempt")
    assert await stored(system, job["id"]) == {
        "batches": 1,
        "batch_rows": 3,
        "row_results": 3,
        "webhook_deliveries": 1,
        "webhook_attempts": 1,
    }

    status, body = await api.request("DELETE", f"/v1/batches/{job['id']}")

    assert (status, body) == (200, {"id": job["id"], "object": "batch.deleted", "deleted": True})
    assert await stored(system, job["id"]) == dict.fromkeys(TABLES, 0)
    for path in (
        f"/v1/batches/{job['id']}",
        f"/v1/batches/{job['id']}/results",
        f"/v1/batches/{job['id']}/webhook_deliveries",
        f"/openai/v1/batches/batch_{job['id']}",
        f"/anthropic/v1/messages/batches/msgbatch_{job['id']}",
    ):
        status, _ = await api.request("GET", path)
        assert status == 404, path


async def _some(items: list[object]) -> bool:
    return bool(items)
