"""``relay-ingest-api``: read settings, open the pool and bus, serve the public API."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

from aiohttp import web

from relay_batches.kit.base import Readiness
from relay_batches.ledger.files import FileStore
from relay_batches.ledger.idempotency import IdempotencyStore
from relay_batches.ledger.jobs import JobStore
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.schema import ledger_readiness, schema_gate
from relay_batches.router.aliases import load_aliases
from relay_batches.runtime import Service, run_service
from relay_batches.services.ingest_api.app import build_app
from relay_batches.services.ingest_api.body import BodyGate
from relay_batches.services.ingest_api.deps import ApiDeps
from relay_batches.services.ingest_api.protocol import ApiRunner
from relay_batches.services.ingest_api.publishing import publisher_for
from relay_batches.services.ingest_api.validation import SubmitLimits
from relay_batches.settings import Settings
from relay_batches.usage import answer_help
from relay_batches.wiring import open_bus, open_pool


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
    aliases = load_aliases(settings.routes_file, os.environ)
    pool = await open_pool(settings, resources, max_size=10)
    bus = await open_bus(settings, resources, "ingest-api")
    jobs = JobStore(pool, page_bytes=settings.results_page_bytes)
    deps = ApiDeps(
        jobs=jobs,
        idempotency=IdempotencyStore(pool),
        announcer=publisher_for(bus, jobs),
        model_known=lambda alias: aliases.resolve(alias) is not None,
        limits=SubmitLimits(settings.max_rows, settings.max_content_bytes),
        max_body_bytes=settings.max_body_bytes,
        max_json_body_bytes=min(settings.max_json_body_bytes, settings.max_body_bytes),
        files=FileStore(pool),
        pool=pool,
        model_names=aliases.names,
        public_base_url=settings.public_base_url,
        body_gate=BodyGate(
            settings.body_read_timeout_s,
            settings.large_body_bytes,
            settings.max_large_bodies,
            settings.body_min_rate,
        ),
        spool_dir=settings.upload_spool_dir,
    )

    gate = schema_gate(pool)
    readiness = Readiness(bus, ledger_readiness(pool, gate))
    app = build_app(deps, KeyStore(pool).workspace_for_key, readiness, gate.current)
    runner = ApiRunner(app, access_log=None, shutdown_timeout=settings.shutdown_grace_s)
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
