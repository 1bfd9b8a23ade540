"""Offload to the providers' batch APIs end to end, every service its own process, the
simulator playing OpenAI's Batch API and Anthropic's Message Batches.

Aliases (tests/helpers/processes.offload_routes): ``sim-half`` is led by an
``openai-batch`` deployment at half the realtime price with ``sim-priced`` behind it;
``sim-claude-half`` the same on Anthropic's. A job on them completes with every row
answered by the batch deployment but the ``[sim:batch-error]`` and
``[sim:batch-expire]`` rows, which go realtime; the job's cost is its rows' costs at
their deployments' prices. A short completion window runs realtime, and a cancel while
the provider batch runs ends the job canceled with the late outcomes discarded.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import asyncpg
import pytest
from openai.types import CreateEmbeddingResponse

from relay_batches.services.relay_cli import admin
from tests.helpers.processes import System, sim_stats, system_fixture
from tests.helpers.support import ApiClient, WebhookReceiver, wait_until

HALF = {"prompt": 500.0, "completion": 1000.0}
FULL = {"prompt": 1000.0, "completion": 2000.0}
ROWS = 2_000
ERROR_ROWS = {7, 500, 1_234}
EXPIRE_ROWS = {9, 999, 1_998}

# A loaded CI machine: each test's waits are generous, more than pytest's default 120 s.
pytestmark = pytest.mark.timeout(300)


# A system whose offloader runs its passes every 0.2 s.
offload_system = system_fixture(
    "offload", RELAY_BATCH_CONCURRENCY="8", RELAY_OFFLOAD_INTERVAL_S="0.2"
)

# A system whose simulated provider batches take 8 s (a cancel lands meanwhile).
slow_system = system_fixture(
    "offload-slow", sim_env={"RELAY_SIM_BATCH_DELAY_S": "8"}, RELAY_OFFLOAD_INTERVAL_S="0.2"
)


async def client(system: System, http: aiohttp.ClientSession, workspace: str) -> ApiClient:
    key = await admin.create_key(system.iso.database_url, workspace)
    return ApiClient(system.api_url, key.key, http)


def marked_rows(count: int) -> list[dict[str, Any]]:
    """``count`` rows, a few of them failing or expiring inside the provider batch."""
    requests = []
    for i in range(count):
        marker = (
            " [sim:batch-error]"
            if i in ERROR_ROWS
            else " [sim:batch-expire]"
            if i in EXPIRE_ROWS
            else ""
        )
        requests.append(
            {"custom_id": f"r-{i}", "messages": [{"role": "user", "content": f"row {i}{marker}"}]}
        )
    return requests


async def detailed_rows(api: ApiClient, batch_id: str) -> list[dict[str, Any]]:
    """Every row of the results with its details (the job is terminal)."""
    status, body = await api.request("GET", f"/v1/batches/{batch_id}/results?include=details")
    assert status == 200, body
    return list(body["data"])


def cost(row: dict[str, Any], price: dict[str, float]) -> float:
    usage = row["usage"]
    return (
        usage["prompt_tokens"] * price["prompt"] + usage["completion_tokens"] * price["completion"]
    ) / 1e6


@pytest.mark.parametrize(
    ("alias", "batch_deployment", "realtime"),
    [
        ("sim-half", "sim-openai-batch", "sim-priced"),
        ("sim-claude-half", "sim-anthropic-batch", "sim-claude-priced"),
    ],
)
async def test_a_job_runs_through_the_batch_api_and_its_failed_rows_go_realtime(
    offload_system: System,
    http: aiohttp.ClientSession,
    alias: str,
    batch_deployment: str,
    realtime: str,
) -> None:
    api = await client(offload_system, http, f"offload-{alias}")
    before = await sim_stats(http, offload_system)
    created = await api.submit({"model": alias, "requests": marked_rows(ROWS)})
    batch = await api.wait_status(created["id"], {"completed", "failed"}, timeout=240)
    assert batch["status"] == "completed", batch
    assert (batch["completed"], batch["failed"]) == (ROWS, 0)

    data = await detailed_rows(api, created["id"])
    assert len(data) == ROWS
    by_index = {int(row["custom_id"][2:]): row for row in data}
    assert sorted(by_index) == list(range(ROWS))
    for index, row in by_index.items():
        assert "content" in row, row
        want = realtime if index in ERROR_ROWS | EXPIRE_ROWS else batch_deployment
        assert row["deployment"] == want, (index, row)
        assert row["attempts"] >= 1
        price = FULL if index in ERROR_ROWS | EXPIRE_ROWS else HALF
        assert row["cost_usd"] == pytest.approx(cost(row, price))
    assert batch["cost_usd"] == pytest.approx(sum(row["cost_usd"] for row in data))

    after = await sim_stats(http, offload_system)
    assert after["batches_created"] > before["batches_created"]
    assert after["batch_rows"] - before["batch_rows"] == ROWS
    assert after["batch_rows_repeated"] == before["batch_rows_repeated"] == 0


async def test_rows_of_a_provider_batch_that_fails_whole_go_realtime(
    offload_system: System, http: aiohttp.ClientSession
) -> None:
    api = await client(offload_system, http, "offload-fail")
    requests = marked_rows(40)
    requests[5]["messages"] = [{"role": "user", "content": "row 5 [sim:batch-fail]"}]
    created = await api.submit({"model": "sim-half", "requests": requests})
    batch = await api.wait_status(created["id"], {"completed", "failed"}, timeout=90)
    assert (batch["status"], batch["completed"]) == ("completed", 40), batch
    data = await detailed_rows(api, created["id"])
    assert {row["deployment"] for row in data} == {"sim-priced"}

    async def settled() -> bool:
        return await provider_batches(offload_system, created["id"]) == {"settled"}

    await wait_until(settled, 60, "the failed provider batch settled")


async def test_pause_holds_rows_not_yet_submitted(
    offload_system: System, http: aiohttp.ClientSession
) -> None:
    """``sim-held-half`` submits exactly 10 rows at a time: a paused job's 5 waiting rows
    stay out of the batch a running job's 10 fill, and go with the next batch once it
    is resumed."""
    api = await client(offload_system, http, "offload-pause")
    held = await api.submit({"model": "sim-held-half", "requests": marked_rows(5)})

    async def waiting() -> bool:
        return await offload_row_states(offload_system, held["id"]) == {"pending"}

    await wait_until(waiting, 60, "the job's rows waiting to be gathered")
    status, body = await api.request("POST", f"/v1/batches/{held['id']}/pause")
    assert status == 200, body
    full = await api.submit({"model": "sim-held-half", "requests": marked_rows(10)})
    done = await api.wait_status(full["id"], {"completed", "failed"}, timeout=90)
    assert (done["status"], done["completed"]) == ("completed", 10)
    assert await offload_row_states(offload_system, held["id"]) == {"pending"}

    status, body = await api.request("POST", f"/v1/batches/{held['id']}/resume")
    assert status == 200, body
    filler = await api.submit({"model": "sim-held-half", "requests": marked_rows(5)})
    for job in (held, filler):
        ended = await api.wait_status(job["id"], {"completed", "failed"}, timeout=90)
        assert (ended["status"], ended["completed"]) == ("completed", 5)
    data = await detailed_rows(api, held["id"])
    assert {row["deployment"] for row in data} == {"sim-held-batch"}


async def test_a_short_completion_window_runs_realtime(
    offload_system: System, http: aiohttp.ClientSession
) -> None:
    api = await client(offload_system, http, "offload-window")
    before = await sim_stats(http, offload_system)
    created = await api.submit(
        # An hour is too short for the batch lane (expected in 12 h, half its window):
        # the lane plan starts it in the fast lanes (a 24h window now offloads).
        {"model": "sim-half", "requests": marked_rows(20), "completion_window": "1h"}
    )
    batch = await api.wait_status(created["id"], {"completed", "failed"}, timeout=90)
    assert batch["status"] == "completed", batch
    data = await detailed_rows(api, created["id"])
    assert {row["deployment"] for row in data} == {"sim-priced"}
    after = await sim_stats(http, offload_system)
    assert after["batches_created"] == before["batches_created"]
    assert after["batch_rows"] == before["batch_rows"]


async def test_a_cancel_mid_offload_ends_canceled_and_discards_late_outcomes(
    slow_system: System, http: aiohttp.ClientSession, webhooks: WebhookReceiver
) -> None:
    api = await client(slow_system, http, "offload-cancel")
    created = await api.submit(
        {"model": "sim-half", "requests": marked_rows(50), "webhookUrl": webhooks.url}
    )

    async def submitted() -> bool:
        return (await sim_stats(http, slow_system))["batch_rows"] >= 50

    await wait_until(submitted, 60, "the rows submitted in a provider batch")
    status, body = await api.request("POST", f"/v1/batches/{created['id']}/cancel")
    assert status == 200, body
    batch = await api.wait_status(created["id"], {"canceled"}, timeout=60)
    assert batch["completed"] == 0

    async def hooked() -> list[dict[str, Any]]:
        return webhooks.for_batch(created["id"])

    await wait_until(hooked, 60, "the webhook")

    # The provider batch is canceled (every row of it is the canceled job's): it ends,
    # what it answered comes back late and the ledger keeps none of it.
    async def settled() -> bool:
        return await provider_batches(slow_system, created["id"]) == {"settled"}

    await wait_until(settled, 90, "the canceled provider batch settled")
    assert (await sim_stats(http, slow_system))["batch_rows_repeated"] == 0
    again = await api.get(created["id"])
    assert (again["status"], again["completed"], again["failed"]) == ("canceled", 0, 0)
    assert len(webhooks.for_batch(created["id"])) == 1


async def test_a_canceled_jobs_rows_answered_with_another_jobs_are_discarded(
    slow_system: System, http: aiohttp.ClientSession
) -> None:
    """``sim-pair-half`` cuts a provider batch at exactly 50 rows: the two jobs' 30 and 20
    rows go in one, however long the second one's intake takes."""
    api = await client(slow_system, http, "offload-late")
    before = await sim_stats(http, slow_system)
    canceled = await api.submit({"model": "sim-pair-half", "requests": marked_rows(30)})
    kept = await api.submit({"model": "sim-pair-half", "requests": marked_rows(20)})

    async def submitted() -> bool:
        return (await sim_stats(http, slow_system))["batch_rows"] - before["batch_rows"] >= 50

    await wait_until(submitted, 60, "both jobs' rows submitted")
    shared = await shared_provider_batches(slow_system, [canceled["id"], kept["id"]])
    assert shared == 1, f"the two jobs' rows went in {shared} provider batches"
    status, body = await api.request("POST", f"/v1/batches/{canceled['id']}/cancel")
    assert status == 200, body
    # The provider batch holds a live job's rows too: it runs to its end, and the
    # canceled job's answers come back after its cancel.
    done = await api.wait_status(kept["id"], {"completed", "failed"}, timeout=90)
    assert (done["status"], done["completed"]) == ("completed", 20)
    after = await sim_stats(http, slow_system)
    assert after["batches_created"] - before["batches_created"] == 1, after

    # Settling the provider batch and dropping the canceled job's unanswered rows run on
    # the offloader's own passes, after the kept job's last outcome: wait for them. Its
    # answered rows are done (published, refused by the ledger); its rows the provider
    # failed or expired are never forwarded for an ended job (dropped).
    async def discarded() -> bool:
        settled = await provider_batches(slow_system, canceled["id"]) == {"settled"}
        return settled and await offload_row_states(slow_system, canceled["id"]) == {
            "done",
            "dropped",
        }

    await wait_until(discarded, 60, "the provider batch settled, the canceled job's rows discarded")
    again = await api.get(canceled["id"])
    assert (again["status"], again["completed"], again["failed"]) == ("canceled", 0, 0)


async def shared_provider_batches(system: System, batch_ids: list[str]) -> int:
    """How many provider batches the rows of the jobs ``batch_ids`` went in."""
    conn = await asyncpg.connect(system.iso.database_url)
    try:
        count = await conn.fetchval(
            "SELECT count(DISTINCT provider_batch) FROM offload_rows WHERE batch_id = ANY($1)",
            batch_ids,
        )
    finally:
        await conn.close()
    return int(count)


async def offload_row_states(system: System, batch_id: str) -> set[str]:
    """The states of a job's offload rows."""
    conn = await asyncpg.connect(system.iso.database_url)
    try:
        records = await conn.fetch(
            "SELECT DISTINCT state FROM offload_rows WHERE batch_id = $1", batch_id
        )
    finally:
        await conn.close()
    return {r[0] for r in records}


async def provider_batches(system: System, batch_id: str) -> set[str]:
    """The states of the provider batches a job's rows went in."""
    conn = await asyncpg.connect(system.iso.database_url)
    try:
        records = await conn.fetch(
            "SELECT DISTINCT b.state FROM offload_rows o"
            " JOIN offload_batches b ON b.id = o.provider_batch WHERE o.batch_id = $1",
            batch_id,
        )
    finally:
        await conn.close()
    return {r[0] for r in records}


async def test_embeddings_rows_run_through_the_batch_api_as_openai_lines(
    offload_system: System, http: aiohttp.ClientSession
) -> None:
    api = await client(offload_system, http, "offload-embeddings")
    before = await sim_stats(http, offload_system)
    requests: list[dict[str, Any]] = [
        {"custom_id": f"e-{i}", "input": f"passage {i}", "dimensions": 16} for i in range(40)
    ]
    requests[7]["input"] = "passage 7 [sim:batch-error]"
    created = await api.submit(
        {"model": "sim-endpoints-half", "endpoint": "/v1/embeddings", "requests": requests}
    )
    batch = await api.wait_status(created["id"], {"completed", "failed"}, timeout=120)
    assert (batch["status"], batch["completed"], batch["failed"]) == ("completed", 40, 0)
    rows = {row["custom_id"]: row for row in await detailed_rows(api, created["id"])}
    for custom_id, row in rows.items():
        answer = CreateEmbeddingResponse.model_validate(row["response"])
        assert len(answer.data[0].embedding) == 16
        want = "sim" if custom_id == "e-7" else "sim-endpoints-batch"
        assert row["deployment"] == want, row
        assert row["usage"]["prompt_tokens"] > 0
    after = await sim_stats(http, offload_system)
    assert after["batch_rows"] - before["batch_rows"] == 40
