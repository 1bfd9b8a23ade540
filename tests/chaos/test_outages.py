"""Chaos, server outages (``make chaos``): one batch per outage — RabbitMQ away 20 s, then
60 s, Postgres away 30 s — really stopped and started (``RELAY_CHAOS_SERVERS=restart``)
or only this system's connections cut and refused meanwhile (``sever``). Nothing lost,
nothing counted twice, one webhook, and no row paid twice: a row-worker whose channel
closed starts no more rows of that slice and publishes the answers it has once the
broker is back; the slice's next holder runs only the rows without an outcome.
Collected only when ``RELAY_CHAOS_SERVERS`` is set."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.chaos.driver import (
    ChaosSettings,
    assert_paid_once_in,
    chaos_started,
    chaos_system,
    run_chaos,
)
from tests.chaos.servers import outage_fault
from tests.chaos.settings import SERVERS_MODE
from tests.helpers.faults import TcpProxy, server_proxies
from tests.helpers.support import WebhookReceiver, create_isolation


@pytest.fixture
async def proxies() -> AsyncIterator[tuple[TcpProxy, TcpProxy]]:
    """Proxies in front of RabbitMQ and Postgres (used by the ``sever`` mode only)."""
    async with server_proxies() as both:
        yield both


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("target", "seconds"), [("rabbitmq", 20), ("rabbitmq", 60), ("postgres", 30)]
)
async def test_an_outage_mid_batch_pays_for_no_row_twice(
    target: str,
    seconds: int,
    output_dir: Path,
    http: aiohttp.ClientSession,
    webhooks: WebhookReceiver,
    proxies: tuple[TcpProxy, TcpProxy],
) -> None:
    settings = ChaosSettings.from_env(rows=3000, latency_ms=80, extra_worker_kills=0)
    iso = await create_isolation("chaosout")
    amqp, pg = proxies
    servers = {}
    if SERVERS_MODE == "sever":
        servers = {
            "RELAY_AMQP_URL": f"amqp://guest:guest@127.0.0.1:{amqp.port}/",
            "RELAY_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{pg.port}/{iso.database}",
        }
    variant = f"outage-{target}-{seconds}s-{SERVERS_MODE}"
    system = chaos_system(iso, output_dir / f"chaos-{variant}", settings, **servers)
    async with chaos_started(system, http) as run:
        fault = outage_fault(target, seconds, SERVERS_MODE, system, amqp, pg)
        report = await run_chaos(
            variant, system, run.api, http, webhooks, settings, [(target, fault)], kills=False
        )
    report.exit_codes = run.codes
    report.write(output_dir / "chaos")

    assert [f.target for f in report.faults] == [target]
    assert all(code == 0 for code in run.codes.values()), f"unclean exits: {run.codes}"
    assert len(webhooks.bodies) == 1, "a webhook arrived after the check"
    assert_paid_once_in(report)  # no kill: no residual window, no row answered twice
