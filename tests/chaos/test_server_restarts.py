"""Chaos, full (``make chaos``): the kill plan, then RabbitMQ and Postgres disrupted
mid-run — really restarted (``RELAY_CHAOS_SERVERS=restart``) or only this system's
connections dropped and refused (``sever``). Collected only when that variable is set."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.chaos.driver import (
    ChaosSettings,
    assert_killed_and_clean,
    assert_paid_once_in,
    chaos_started,
    chaos_system,
    run_chaos,
)
from tests.chaos.servers import restart_faults, sever_faults
from tests.chaos.settings import SERVERS_MODE
from tests.helpers.faults import TcpProxy, server_proxies
from tests.helpers.processes import SERVICES
from tests.helpers.support import WebhookReceiver, create_isolation


@pytest.fixture
async def proxies() -> AsyncIterator[tuple[TcpProxy, TcpProxy]]:
    """Proxies in front of RabbitMQ and Postgres (used by the ``sever`` mode only)."""
    async with server_proxies() as both:
        yield both


@pytest.mark.timeout(900)
async def test_kills_and_server_disruptions_mid_batch_lose_nothing(
    output_dir: Path,
    http: aiohttp.ClientSession,
    webhooks: WebhookReceiver,
    proxies: tuple[TcpProxy, TcpProxy],
) -> None:
    settings = ChaosSettings.from_env(rows=5000, latency_ms=80, extra_worker_kills=4)
    iso = await create_isolation("chaosfull")
    amqp, pg = proxies
    servers = {}
    if SERVERS_MODE == "sever":
        servers = {
            "RELAY_AMQP_URL": f"amqp://guest:guest@127.0.0.1:{amqp.port}/",
            "RELAY_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{pg.port}/{iso.database}",
        }
    system = chaos_system(iso, output_dir / f"chaos-{SERVERS_MODE}", settings, **servers)
    async with chaos_started(system, http) as run:
        faults = (
            restart_faults() if SERVERS_MODE == "restart" else sever_faults(system, amqp, pg, http)
        )
        report = await run_chaos(
            f"full-{SERVERS_MODE}", system, run.api, http, webhooks, settings, faults
        )
    report.exit_codes = run.codes
    report.write(output_dir / "chaos")

    assert_killed_and_clean(report, SERVICES, settings)
    assert [f.target for f in report.faults if f.kind == "server"] == ["rabbitmq", "postgres"]
    assert len(webhooks.bodies) == 1, "a webhook arrived after the check"
    assert_paid_once_in(report)
