"""Chaos of the offload (part of ``make test``): ``kill -9`` of the offloader in each of
its windows, one job walking through all three in turn: between recording a provider
batch and creating it, while the provider batch runs (polling), and while its outcomes
are being published. The job completes with every row once, no row is ever submitted in
two provider batches (the simulator's ``batch_rows_repeated``), one webhook.

The windows are held open by the simulator, not met by luck, so a slow or starved run
lands in them all the same: an upload is answered :data:`INPUT_DELAY_S` after it was
read (the record sits recorded, nothing created at the provider), the provider batch
takes :data:`BATCH_DELAY_S` (submitted, polled), and a results download stops
:data:`RESULTS_PAUSE_S` halfway through its lines (the first half's outcomes published
and marked done, the rest not). Each kill is checked where it landed: the offloader
dead, the ledger holds what it left.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from relay_batches.services.relay_cli import admin
from tests.chaos.driver import RESTART_READY_TIMEOUT_S, ChaosSettings, chaos_system
from tests.helpers.checks import assert_exactly_once, wait_terminal
from tests.helpers.processes import System, sim_stats
from tests.helpers.support import (
    ApiClient,
    WebhookReceiver,
    create_isolation,
    drop_isolation,
    wait_until,
)

ROWS = 6_000
ERROR_ROWS = {11, 4_321}
WINDOW_TIMEOUT_S = 90
INPUT_DELAY_S = 6  # each below the deployment's timeout_s (30 s), which cuts a read
BATCH_DELAY_S = 8
RESULTS_PAUSE_S = 8


def requests() -> list[dict[str, object]]:
    """Rows answered by the provider batch but two, which fail there and go realtime."""
    return [
        {
            "custom_id": f"r-{i}",
            "messages": [
                {
                    "role": "user",
                    "content": f"row {i}" + (" [sim:batch-error]" if i in ERROR_ROWS else ""),
                }
            ],
        }
        for i in range(ROWS)
    ]


def window(conn: asyncpg.Connection, query: str) -> Callable[[], Awaitable[bool]]:
    """A condition: ``query`` answers true (on one connection: polled often)."""

    async def reached() -> bool:
        return bool(await conn.fetchval(query))

    return reached


async def provider_batch(conn: asyncpg.Connection) -> asyncpg.Record:
    """The one provider batch record: its state, provider id and rows done."""
    record = await conn.fetchrow(
        "SELECT b.state, b.provider_id,"
        " (SELECT count(*) FROM offload_rows o"
        "  WHERE o.provider_batch = b.id AND o.state = 'done') AS done"
        " FROM offload_batches b"
    )
    assert record is not None, "no provider batch recorded"
    return record


async def kill_offloader(system: System, conn: asyncpg.Connection) -> asyncpg.Record:
    """``kill -9`` the offloader; the provider batch as it left it (nothing moves it
    until :func:`restart_offloader`)."""
    proc = system.processes["offloader"]
    proc.signal(signal.SIGKILL)
    code = await asyncio.to_thread(proc.wait, 10)
    assert code == -signal.SIGKILL, f"the offloader exited with {code} instead of being killed"
    return await provider_batch(conn)


async def restart_offloader(system: System, http: aiohttp.ClientSession) -> None:
    """Start the killed offloader again."""
    proc = system.processes["offloader"]
    proc.start()
    await proc.wait_ready(http, RESTART_READY_TIMEOUT_S)


@pytest.mark.timeout(300)
async def test_kill_9_of_the_offloader_in_each_window_answers_every_row_once(
    output_dir: Path, http: aiohttp.ClientSession, webhooks: WebhookReceiver
) -> None:
    settings = ChaosSettings.from_env(rows=ROWS, latency_ms=5, extra_worker_kills=0)
    iso = await create_isolation("chaosoffload")
    system = chaos_system(
        iso,
        output_dir / "chaos-offload",
        settings,
        RELAY_OFFLOAD_INTERVAL_S="1",
    )
    system.processes["upstream-sim"].env.update(
        RELAY_SIM_BATCH_DELAY_S=str(BATCH_DELAY_S),
        RELAY_SIM_BATCH_INPUT_DELAY_S=str(INPUT_DELAY_S),
        RELAY_SIM_BATCH_RESULTS_PAUSE_S=str(RESULTS_PAUSE_S),
    )
    try:
        await system.start_all(http)
        conn = await asyncpg.connect(iso.database_url, timeout=10)
        key = await admin.create_key(iso.database_url, "chaos-offload")
        api = ApiClient(system.api_url, key.key, http)
        batch = await api.submit(
            {"model": "sim-half", "requests": requests(), "webhookUrl": webhooks.url}
        )
        # 1. Recorded (its rows chosen in the ledger), its input built and held in the
        #    upload: nothing created at the provider.
        await wait_until(
            window(conn, "SELECT true FROM offload_batches WHERE state = 'recorded' AND polls = 0"),
            WINDOW_TIMEOUT_S,
            "a provider batch recorded, not yet created",
            0.05,
        )
        left = await kill_offloader(system, conn)
        assert left["state"] in ("recorded", "creating") and left["provider_id"] is None, left
        assert (await sim_stats(http, system))["batches_created"] == 0
        await restart_offloader(system, http)
        # 2. Created: the provider runs it, the offloader polls.
        await wait_until(
            window(conn, "SELECT true FROM offload_batches WHERE state = 'submitted'"),
            WINDOW_TIMEOUT_S,
            "a provider batch submitted",
            0.05,
        )
        left = await kill_offloader(system, conn)
        assert (left["state"], left["done"]) == ("submitted", 0), left
        await restart_offloader(system, http)
        # 3. Ended, its outcomes partly published (the first half of the output read and
        #    its rows done, the download held halfway, the record not settled).
        await wait_until(
            window(
                conn,
                "SELECT true FROM offload_rows o JOIN offload_batches b ON b.id = o.provider_batch"
                " WHERE o.state = 'done' AND b.state = 'ended' LIMIT 1",
            ),
            WINDOW_TIMEOUT_S,
            "outcomes being published",
            0.05,
        )
        left = await kill_offloader(system, conn)
        assert left["state"] == "ended" and 0 < left["done"] <= ROWS // 2, left
        await restart_offloader(system, http)
        await conn.close()

        await wait_terminal(api, batch["id"], 120)
        await assert_exactly_once(
            api, iso.database_url, batch["id"], [f"r-{i}" for i in range(ROWS)], webhooks
        )
        stats = await sim_stats(http, system)
        assert stats["batch_rows_repeated"] == 0, stats
        assert stats["batches_created"] == 1, stats
        data = (await api.results(batch["id"]))["data"]
        assert all("content" in row for row in data)
    finally:
        codes = await asyncio.to_thread(system.stop_all)
        await drop_isolation(iso)
    assert all(code == 0 for code in codes.values()), f"unclean exits after chaos: {codes}"
    assert len(webhooks.bodies) == 1, "a webhook arrived after the check"
