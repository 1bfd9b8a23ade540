"""Chaos, kill-only (part of ``make test``): ``kill -9`` of every kind of service, the
row-workers several times, in the middle of a 5,000-row batch; nothing is lost, nothing
counted twice, one webhook. And a batch paused and resumed between kills: the same."""

from __future__ import annotations

import random
import time
from dataclasses import asdict
from pathlib import Path

import aiohttp
import pytest

from tests.chaos.driver import (
    ChaosReport,
    ChaosSettings,
    Fault,
    assert_killed_and_clean,
    assert_paid_once_in,
    chaos_started,
    chaos_system,
    check_paid,
    kill_and_restart,
    run_chaos,
    wait_for_progress,
)
from tests.helpers.checks import assert_exactly_once, wait_terminal
from tests.helpers.processes import SERVICES, System
from tests.helpers.support import (
    ApiClient,
    WebhookReceiver,
    create_isolation,
    rows,
)

# Killed while the batch is paused (the ingest-api last: the resume goes to its restart);
# the dispatcher is killed before the pause and after the resume.
WHILE_PAUSED = ("aggregator", "row-worker", "ingest-api")


@pytest.mark.timeout(300)
async def test_kill_9_of_every_service_mid_batch_loses_nothing_and_counts_nothing_twice(
    output_dir: Path, http: aiohttp.ClientSession, webhooks: WebhookReceiver
) -> None:
    settings = ChaosSettings.from_env(rows=5000, latency_ms=40, extra_worker_kills=3)
    iso = await create_isolation("chaos")
    system = chaos_system(iso, output_dir / "chaos-kills", settings)
    async with chaos_started(system, http) as run:
        report = await run_chaos("kills", system, run.api, http, webhooks, settings, [])
    report.exit_codes = run.codes
    report.write(output_dir / "chaos")

    assert_killed_and_clean(report, SERVICES, settings)
    assert len(webhooks.bodies) == 1, "a webhook arrived after the check"
    # Four of the kills were row-workers': their redelivered slices ran only the rows
    # without an outcome (tests/chaos/paid.py: the residual window aside).
    assert_paid_once_in(report)


@pytest.mark.timeout(240)
async def test_a_batch_paused_and_resumed_between_kills_ends_with_every_row_once(
    output_dir: Path, http: aiohttp.ClientSession, webhooks: WebhookReceiver
) -> None:
    settings = ChaosSettings.from_env(rows=2000, latency_ms=40, extra_worker_kills=0)
    iso = await create_isolation("chaospause")
    system = chaos_system(iso, output_dir / "chaos-pause", settings)
    report = ChaosReport("pause", settings.seed, settings.rows, settings.latency_ms)
    async with chaos_started(system, http) as run:
        api = run.api
        batch = await api.submit(
            {"model": "gpt-4o-mini", "requests": rows(settings.rows), "webhookUrl": webhooks.url}
        )
        started = time.monotonic()
        await pause_between_kills(system, api, http, batch["id"], settings, report)
        await wait_terminal(api, batch["id"], 180)
        report.elapsed_s = round(time.monotonic() - started, 1)
        ids = [f"r-{i}" for i in range(settings.rows)]
        verdict = await assert_exactly_once(api, iso.database_url, batch["id"], ids, webhooks)
        report.verdict = asdict(verdict)
        await check_paid(report, http, system)
    report.exit_codes = codes = run.codes
    report.write(output_dir / "chaos")
    assert all(code == 0 for code in codes.values()), f"unclean exits after chaos: {codes}"
    assert_paid_once_in(report)


async def pause_between_kills(
    system: System,
    api: ApiClient,
    http: aiohttp.ClientSession,
    batch_id: str,
    settings: ChaosSettings,
    report: ChaosReport,
) -> None:
    """Kill, pause, kill while paused, resume (through a restarted ingest-api), kill
    again, each kill once the batch moved on by a random step (while paused: at once)."""
    rng, url, done = random.Random(settings.seed), system.iso.database_url, 0

    async def kill(names: tuple[str, ...], moved: bool) -> None:
        nonlocal done
        for name in names:
            if moved:
                step = rng.randint(settings.min_step, settings.max_step)
                done = await wait_for_progress(url, [batch_id], done + step, f"killing {name}")
            target = rng.choice(["row-worker", "row-worker#2"]) if name == "row-worker" else name
            report.faults.append(await kill_and_restart(system, target, http, done))

    await kill(("dispatcher",), moved=True)
    status, paused = await api.request("POST", f"/v1/batches/{batch_id}/pause")
    assert (status, paused["status"]) == (200, "paused"), paused
    paused_at = time.monotonic()
    await kill(WHILE_PAUSED, moved=False)
    status, resumed = await api.request("POST", f"/v1/batches/{batch_id}/resume")
    assert (status, resumed["status"]) == (200, "queued"), resumed
    report.faults.append(Fault("pause", batch_id, done, round(time.monotonic() - paused_at, 2)))
    await kill(("dispatcher",), moved=True)
