"""Expiry over real processes: a native job with a short ``completion_window`` whose rows
are slow ends ``expired`` at its deadline; the rows finished by then keep their results,
the webhook says ``expired``, and the other rows never reach the simulator."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import aiohttp

from tests.helpers.processes import System, sim_calls
from tests.helpers.support import (
    ApiClient,
    WebhookReceiver,
    rows,
    rows_queue_depth,
    wait_until,
)

ROWS = 3000
ROW_DELAY_MS = 300  # 8 slots: about 27 rows a second, far from all 3000 in the window
WINDOW_S = 6
SLOTS = 8  # RELAY_BATCH_CONCURRENCY of the e2e system


def _instant(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


async def test_a_job_past_its_completion_window_ends_expired_keeping_what_finished(
    api: ApiClient, system: System, http: aiohttp.ClientSession, webhooks: WebhookReceiver
) -> None:
    calls_before = await sim_calls(http, system)
    template = f"slow row {{i}} [sim:delay-ms={ROW_DELAY_MS}]"
    created = await api.submit(
        {
            "model": "gpt-4o-mini",
            "requests": rows(ROWS, template),
            "webhookUrl": webhooks.url,
            "completion_window": f"{WINDOW_S}s",
            "metadata": {"suite": "e2e-expiry"},
        }
    )
    batch_id = created["id"]
    deadline = _instant(created["expires_at"])
    assert abs(deadline - _instant(created["created_at"]) - timedelta(seconds=WINDOW_S)) <= (
        timedelta(seconds=1)
    )
    assert created["metadata"] == {"suite": "e2e-expiry"}

    expired = await api.wait_status(batch_id, {"expired"}, timeout=WINDOW_S + 30)
    calls_at_expiry = await sim_calls(http, system)
    assert _instant(expired["completed_at"]) >= deadline
    kept = expired["completed"] + expired["failed"]
    assert 0 < kept < ROWS

    async def drained() -> bool:
        return await rows_queue_depth(system.iso.namespace) == 0

    await wait_until(drained, 30, "the expired job's rows to leave the broker")
    await wait_until(lambda: _some(webhooks.for_batch(batch_id)), 15, "the expiry webhook")
    calls = await sim_calls(http, system)
    # Beyond the rows kept, only calls in flight at the deadline reached the simulator
    # (each row-worker slot at most one, its outcome then discarded, plus the few
    # outcomes still on their way to the ledger); nothing started after.
    assert calls - calls_before <= kept + 2 * SLOTS, (calls - calls_before, kept)
    assert calls - calls_at_expiry <= SLOTS, (calls, calls_at_expiry)

    final = await api.get(batch_id)
    assert final["status"] == "expired"
    assert (final["completed"], final["failed"]) == (expired["completed"], expired["failed"])
    data = (await api.results(batch_id))["data"]
    assert len(data) == kept
    for row in data:
        index = int(row["custom_id"].split("-")[1])
        assert row == {"custom_id": f"r-{index}", "content": f"echo: {template.format(i=index)}"}
    [hook] = webhooks.for_batch(batch_id)
    assert hook["status"] == "expired"
    assert (hook["completed"], hook["failed"]) == (final["completed"], final["failed"])

    status, again = await api.request("POST", f"/v1/batches/{batch_id}/cancel")
    assert status == 409
    assert again["error"]["message"] == "batch is already expired"


async def _some(items: list[object]) -> bool:
    return bool(items)
