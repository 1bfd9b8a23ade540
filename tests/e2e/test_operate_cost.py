"""Cost and budget end to end, every service its own process: the priced simulator alias
(``sim-priced``: 1,000 USD per million prompt tokens, 2,000 per million completion
tokens, so a few tokens cost a visible fraction of a cent) gives each row its cost and the
batch their sum, the webhook carries it, and a small budget stops a 200-row job."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from relay_batches.services.relay_cli import admin
from tests.helpers.processes import System, system_fixture
from tests.helpers.support import ApiClient, WebhookReceiver, rows, wait_until

PRICED = "sim-priced"
PROMPT_PER_MTOK, COMPLETION_PER_MTOK = 1000.0, 2000.0
WINDOW = 32  # the budget test's dispatch window: rows released ahead of the outcomes


# A system whose dispatcher keeps at most ``WINDOW`` rows of a workspace in flight (the
# session system's 256 would release a 200-row job whole before any outcome, and a budget
# withholds only rows not yet released).
small_window = system_fixture(
    "cost", RELAY_BATCH_CONCURRENCY="4", RELAY_DISPATCH_WINDOW=str(WINDOW), RELAY_SLICE_ROWS="4"
)


async def detailed_rows(api: ApiClient, batch_id: str) -> list[dict[str, Any]]:
    """Every row of the results with its details (the job is terminal)."""
    status, body = await api.request("GET", f"/v1/batches/{batch_id}/results?include=details")
    assert status == 200, body
    return list(body["data"])


def priced(row: dict[str, Any]) -> float:
    """What the routes' price makes of a row's tokens."""
    usage = row["usage"]
    return (
        usage["prompt_tokens"] * PROMPT_PER_MTOK + usage["completion_tokens"] * COMPLETION_PER_MTOK
    ) / 1e6


async def test_priced_routes_give_each_row_its_cost_and_the_batch_and_webhook_their_sum(
    api: ApiClient, webhooks: WebhookReceiver
) -> None:
    created = await api.submit(
        {"model": PRICED, "requests": rows(20, "price row {i}"), "webhookUrl": webhooks.url}
    )
    assert (created["cost_usd"], created["budget_usd"]) == (0, None)
    batch = await api.wait_status(created["id"], {"completed"}, timeout=30)
    data = await detailed_rows(api, created["id"])

    assert [row["custom_id"] for row in data] == [f"r-{i}" for i in range(20)]
    for row in data:
        assert row["content"] == f"echo: price row {row['custom_id'][2:]}"
        assert row["deployment"] == PRICED
        assert row["usage"]["prompt_tokens"] > 0 and row["usage"]["completion_tokens"] > 0
        assert row["cost_usd"] == pytest.approx(priced(row))
        assert isinstance(row["latency_ms"], int) and row["latency_ms"] >= 0
    assert batch["cost_usd"] > 0.01
    assert batch["cost_usd"] == pytest.approx(sum(row["cost_usd"] for row in data))

    async def delivered() -> list[dict[str, Any]]:
        return webhooks.for_batch(created["id"])

    await wait_until(delivered, 15, "the completion webhook")
    [hook] = webhooks.for_batch(created["id"])
    assert hook["status"] == "completed"
    assert hook["cost_usd"] == batch["cost_usd"]


async def test_an_unpriced_alias_costs_nothing(api: ApiClient) -> None:
    created = await api.submit({"model": "gpt-4o-mini", "requests": rows(3)})
    batch = await api.wait_status(created["id"], {"completed"}, timeout=30)
    assert batch["cost_usd"] == 0
    assert all("cost_usd" not in row for row in await detailed_rows(api, created["id"]))


async def test_a_small_budget_stops_a_200_row_job(
    small_window: System, http: aiohttp.ClientSession
) -> None:
    key = await admin.create_key(small_window.iso.database_url, "cost-budget")
    api = ApiClient(small_window.api_url, key.key, http)
    budget = 0.1  # a row of these costs about 0.02 USD: the budget lasts a few rows
    created = await api.submit(
        {
            "model": PRICED,
            "requests": rows(200, "budget row {i} [sim:delay-ms=20]"),
            "budget_usd": budget,
        }
    )
    assert created["budget_usd"] == budget

    batch = await api.wait_status(created["id"], {"completed", "failed"}, timeout=60)
    assert batch["status"] == "failed"
    assert batch["error"].startswith("budget_exceeded")
    assert batch["completed"] + batch["failed"] == batch["total"] == 200

    data = await detailed_rows(api, created["id"])
    answered = [row for row in data if "content" in row]
    withheld = [row for row in data if "error" in row]
    assert len(answered) == batch["completed"] and len(withheld) == batch["failed"]
    assert all(row["error"].startswith("budget_exceeded") for row in withheld)
    assert all(row["attempts"] == 0 and row["deployment"] is None for row in withheld)
    # the budget was reached, and only rows released by then (at most a window) ran on
    costs = [row["cost_usd"] for row in answered]
    assert batch["cost_usd"] >= budget
    assert batch["cost_usd"] - max(costs) < budget + WINDOW * max(costs)
    assert 0 < len(answered) <= budget / min(costs) + WINDOW
    assert batch["cost_usd"] == pytest.approx(sum(costs))
