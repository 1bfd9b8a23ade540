"""Chaos, kill-only (part of ``make test``): ``kill -9`` of every kind of service, the
row-workers several times, in the middle of a 5,000-row batch; nothing is lost, nothing
counted twice, one webhook."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from relay_batches.services.relay_cli import admin
from tests.chaos.driver import ChaosSettings, assert_killed_and_clean, chaos_system, run_chaos
from tests.helpers.processes import SERVICES
from tests.helpers.support import ApiClient, WebhookReceiver, create_isolation, drop_isolation


@pytest.mark.timeout(300)
async def test_kill_9_of_every_service_mid_batch_loses_nothing_and_counts_nothing_twice(
    output_dir: Path, http: aiohttp.ClientSession, webhooks: WebhookReceiver
) -> None:
    settings = ChaosSettings.from_env(rows=5000, latency_ms=40, extra_worker_kills=3)
    iso = await create_isolation("chaos")
    system = chaos_system(iso, output_dir / "chaos-kills", settings)
    try:
        await system.start_all(http)
        key = await admin.create_key(iso.database_url, "chaos")
        api = ApiClient(system.api_url, key.key, http)
        report = await run_chaos("kills", system, api, http, webhooks, settings, [])
    finally:
        codes = await asyncio.to_thread(system.stop_all)
        await drop_isolation(iso)
    report.exit_codes = codes
    report.write(output_dir / "chaos")

    assert_killed_and_clean(report, SERVICES, settings)
    assert len(webhooks.bodies) == 1, "a webhook arrived after the check"
