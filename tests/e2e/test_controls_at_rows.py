"""Controls act on the rows not yet started, end to end, every service its own process, at
the default slice (64 rows) and window (1,024 rows), so a small job is released whole
before any row runs: a pause stands the job still within a second (no new upstream call)
and a resume runs every row once; a budget stops a job at about the rows it pays for
(issue 27: a 40-row job at 300 ms paused after 0.8 s, a 200-row job at 50 ms with a
budget worth about 20 rows)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from tests.helpers.checks import assert_exactly_once
from tests.helpers.processes import System, signed_in, sim_calls, system_fixture
from tests.helpers.support import ApiClient, rows

WORKERS, CONCURRENCY = 2, 4
PAUSE_ROWS, PAUSE_TEMPLATE = 40, "pause row {i} [sim:delay-ms=300]"
BUDGET_ROWS, BUDGET_TEMPLATE = 200, "budget row {i:03d} [sim:delay-ms=50]"
LONG_ANSWER_TEMPLATE = "long row {i:03d} [sim:delay-ms=50] [sim:reply-bytes=2000]"
BUDGET_WORTH_ROWS = 20
ROW_S, STOP_TRAVEL_S = 0.05, 0.3  # a budget row's time upstream; the stop's way, loaded
STILL_WITHIN_S, STILL_FOR_S = 1.0, 2.0

controls = system_fixture("controls", workers=WORKERS, RELAY_BATCH_CONCURRENCY=str(CONCURRENCY))


async def post(api: ApiClient, batch_id: str, verb: str) -> dict[str, object]:
    status, body = await api.request("POST", f"/v1/batches/{batch_id}/{verb}")
    assert status == 200, body
    return dict(body)


async def test_a_paused_job_stands_still_within_a_second_and_resumes_every_row_once(
    controls: System, http: aiohttp.ClientSession
) -> None:
    api = await signed_in(controls, http, "controls-pause")
    before = await sim_calls(http, controls)
    created = await api.submit(
        {"model": "gpt-4o-mini", "requests": rows(PAUSE_ROWS, PAUSE_TEMPLATE)}
    )
    batch_id = created["id"]
    await api.wait_status(batch_id, {"running"}, timeout=30)
    await asyncio.sleep(0.8)

    assert (await post(api, batch_id, "pause"))["status"] == "paused"
    paused_at = time.monotonic()
    await asyncio.sleep(STILL_WITHIN_S)
    started = await sim_calls(http, controls) - before
    await asyncio.sleep(STILL_FOR_S)
    later = await sim_calls(http, controls) - before
    waited = time.monotonic() - paused_at

    assert later == started < PAUSE_ROWS, (
        f"{started} upstream calls {STILL_WITHIN_S} s after the pause, {later} after"
        f" {waited:.1f} s: the pause did not stand the job still"
    )
    batch = await api.get(batch_id)
    assert batch["status"] == "paused"
    assert batch["completed"] + batch["failed"] <= started

    assert (await post(api, batch_id, "resume"))["status"] == "queued"
    await api.wait_status(batch_id, {"completed"}, timeout=60)
    await assert_exactly_once(
        api,
        controls.iso.database_url,
        batch_id,
        [f"r-{i}" for i in range(PAUSE_ROWS)],
        contents=[f"echo: {PAUSE_TEMPLATE.format(i=i)}" for i in range(PAUSE_ROWS)],
    )
    assert await sim_calls(http, controls) - before == PAUSE_ROWS, "a row was paid twice"


async def budget_run(
    controls: System, http: aiohttp.ClientSession, workspace: str, template: str
) -> tuple[dict[str, Any], int, float, float]:
    """A 200-row job of ``template`` with a budget worth 20.5 of its rows, run to its end:
    the batch, the upstream calls it made, its budget and the cost of one row."""
    api = await signed_in(controls, http, workspace)
    # One row of the same size prices a row (every row below has as many tokens).
    probe = await api.submit({"model": "sim-priced", "requests": rows(1, template)})
    row_cost = (await api.wait_status(probe["id"], {"completed"}, timeout=30))["cost_usd"]
    assert row_cost > 0
    budget = round(row_cost * (BUDGET_WORTH_ROWS + 0.5), 6)
    before = await sim_calls(http, controls)
    created = await api.submit(
        {"model": "sim-priced", "requests": rows(BUDGET_ROWS, template), "budget_usd": budget}
    )
    batch = await api.wait_status(created["id"], {"completed", "failed"}, timeout=60)
    return batch, await sim_calls(http, controls) - before, budget, row_cost


def assert_stopped_at_the_rows_started(
    batch: dict[str, Any], calls: int, budget: float, row_cost: float, slack_rows: int
) -> None:
    """Ended ``failed`` with ``budget_exceeded``, every row with an outcome, having run
    the rows the budget paid for, the one that reached it and at most ``slack_rows``."""
    assert batch["status"] == "failed", batch
    assert batch["error"].startswith("budget_exceeded"), batch
    assert batch["completed"] + batch["failed"] == BUDGET_ROWS
    assert batch["cost_usd"] >= budget
    assert batch["completed"] <= BUDGET_WORTH_ROWS + 1 + slack_rows, batch
    assert calls <= BUDGET_WORTH_ROWS + 1 + slack_rows, f"{calls} upstream calls"
    assert batch["cost_usd"] <= budget + (1 + slack_rows) * row_cost


async def test_a_budget_worth_20_rows_stops_a_200_row_job_at_the_rows_started(
    controls: System, http: aiohttp.ClientSession
) -> None:
    batch, calls, budget, row_cost = await budget_run(
        controls, http, "controls-budget", BUDGET_TEMPLATE
    )
    # At most the rows started when the budget was reached ran past it: every slot of
    # every worker, beyond the row that crossed it.
    assert_stopped_at_the_rows_started(batch, calls, budget, row_cost, WORKERS * CONCURRENCY)


async def test_rows_released_past_a_budget_the_estimate_missed_are_withheld_unstarted(
    controls: System, http: aiohttp.ClientSession
) -> None:
    # Answers of 2,000 bytes from requests of about 80: the price of the request size
    # underestimates a row some fifteen times, so the dispatcher releases every row
    # before any cost is recorded, and only the row-workers can hold the rest back.
    batch, calls, budget, row_cost = await budget_run(
        controls, http, "controls-budget-missed", LONG_ANSWER_TEMPLATE
    )
    # Every slot of every worker, and those started again while the stop travelled from
    # the answer that reached the budget to the workers (the worker's outcome linger, the
    # aggregator's chunk, the event): allowed STOP_TRAVEL_S at full speed.
    slots = WORKERS * CONCURRENCY
    assert_stopped_at_the_rows_started(
        batch, calls, budget, row_cost, slots + round(slots * STOP_TRAVEL_S / ROW_S)
    )
