"""``relay-ingest-api``: read settings, open the pool and bus, serve the public API."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from datetime import UTC, datetime

from aiohttp import web

from relay_batches.kit.base import Readiness
from relay_batches.ledger.files import FileStore
from relay_batches.ledger.idempotency import IdempotencyStore
from relay_batches.ledger.jobs import MAX_LONG_STORES, JobStore, long_store_slots
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.schema import ledger_readiness, schema_gate
from relay_batches.netguard import UrlGuard
from relay_batches.router.aliases import load_aliases
from relay_batches.runtime import Service, run_service
from relay_batches.services.ingest_api.app import build_app
from relay_batches.services.ingest_api.deps import ApiDeps
from relay_batches.services.ingest_api.edge.body import BodyGate
from relay_batches.services.ingest_api.edge.protocol import ApiRunner
from relay_batches.services.ingest_api.fleet import Fleet, FleetWatch
from relay_batches.services.ingest_api.publishing import publisher_for
from relay_batches.services.ingest_api.rows.validation import (
    SubmitLimits,
)
from relay_batches.settings import ConfigError, Settings, check_spool_dir, pool_bounds
from relay_batches.usage import answer_help
from relay_batches.wiring import open_bus, open_pool

POOL_MAX = 10  # the API's own pool maximum (RELAY_DB_POOL_MAX_SIZE overrides it)
SHORT_QUERY_CONNECTIONS = 2  # kept for key lookups and short queries beside long stores


def check_ingest_settings(settings: Settings) -> None:
    """:class:`ConfigError` (one line) for settings the API cannot serve with: a spool
    directory it cannot write in, or a pool the long stores could take whole."""
    check_spool_dir(settings.upload_spool_dir)
    _, max_size = pool_bounds(settings, POOL_MAX)
    needed = MAX_LONG_STORES + SHORT_QUERY_CONNECTIONS
    if max_size < needed:
        raise ConfigError(
            f"RELAY_DB_POOL_MAX_SIZE ({max_size}) is below {needed}, what the ingest-api"
            f" needs: {MAX_LONG_STORES} for uploads storing at once"
            f" + {SHORT_QUERY_CONNECTIONS} for every other request"
        )


class IngestService:
    """Serves the API until stopped."""

    def __init__(self, runner: web.AppRunner, readiness: Readiness) -> None:
        self._runner = runner
        self._readiness = readiness

    async def ready(self) -> bool:
        """Listening, connected to the broker, the ledger reachable at its schema."""
        return await self._readiness()

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop``; then stop accepting and finish open requests."""
        self._readiness.consuming = True
        await stop.wait()
        self._readiness.consuming = False
        await self._runner.cleanup()


async def build(
    settings: Settings, log: logging.Logger, resources: contextlib.AsyncExitStack
) -> Service:
    """Build the API from settings and start listening."""
    check_ingest_settings(settings)
    aliases = load_aliases(settings.routes_file, os.environ)
    pool = await open_pool(settings, resources, max_size=POOL_MAX)
    bus = await open_bus(settings, resources, "ingest-api")
    watch = FleetWatch()
    await watch.start(bus)
    long_stores = long_store_slots()
    jobs = JobStore(pool, page_bytes=settings.results_page_bytes, long_stores=long_stores)
    deps = ApiDeps(
        jobs=jobs,
        idempotency=IdempotencyStore(pool),
        announcer=publisher_for(bus, jobs),
        model_known=lambda alias: aliases.resolve(alias) is not None,
        limits=SubmitLimits(settings.max_rows, settings.max_content_bytes, settings.max_row_bytes),
        max_body_bytes=settings.max_body_bytes,
        max_json_body_bytes=settings.max_json_body_bytes,
        files=FileStore(pool, long_stores),
        pool=pool,
        model_names=aliases.names,
        aliases=aliases,
        routes_loaded_at=datetime.fromtimestamp(os.stat(settings.routes_file).st_mtime, UTC),
        public_base_url=settings.public_base_url,
        body_gate=BodyGate(
            settings.body_read_timeout_s,
            settings.large_body_bytes,
            settings.max_large_bodies,
            settings.body_min_rate,
        ),
        spool_dir=settings.upload_spool_dir,
        fleet=Fleet(watch, bus),
        url_guard=UrlGuard(settings.webhook_allow_networks, settings.webhook_timeout_s),
    )

    gate = schema_gate(pool)
    readiness = Readiness(bus, ledger_readiness(pool, gate))
    app = build_app(deps, KeyStore(pool).workspace_for_key, readiness, gate.current)
    runner = ApiRunner(
        app,
        header_timeout_s=settings.header_timeout_s,
        keepalive_s=settings.keepalive_s,
        max_connections=settings.max_connections,
        access_log=None,
        shutdown_timeout=settings.shutdown_grace_s,
    )
    await runner.setup()
    await web.TCPSite(runner, settings.api_host, settings.api_port).start()
    log.info("listening", extra={"host": settings.api_host, "port": settings.api_port})
    return IngestService(runner, readiness)


def main() -> None:
    """Console entry point: the API port also serves /healthz and /readyz; the health port
    (``RELAY_HEALTH_PORT``) serves those and /metrics."""
    answer_help("relay-ingest-api", "Serves the public API, the panel and /openapi.json.")
    run_service("ingest-api", build)


if __name__ == "__main__":
    main()
