"""The small HTTP port every service serves: ``/healthz``, ``/readyz`` and ``/metrics``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CollectorRegistry

from relay_batches.metrics import render_metrics

ReadyCheck = Callable[[], Awaitable[bool]]


def add_health_routes(
    app: web.Application, ready: ReadyCheck, *, metrics: CollectorRegistry | None = None
) -> None:
    """Add the service endpoints to ``app``; ``ready`` says whether deps are up; ``/metrics``
    serves the registry ``metrics``. Without one, only the probes (``/metrics`` is for the
    health port, never a public one)."""

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        if await ready():
            return web.json_response({"status": "ready"})
        return web.json_response({"status": "not_ready"}, status=503)

    async def render(_: web.Request) -> web.Response:
        assert metrics is not None
        body, content_type = render_metrics(metrics)
        return web.Response(body=body, headers={"Content-Type": content_type})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if metrics is not None:
        app.router.add_get("/metrics", render)


async def start_health_server(
    host: str, port: int, ready: ReadyCheck, metrics: CollectorRegistry
) -> web.AppRunner:
    """Serve the health endpoints and ``metrics`` on ``host:port`` (0 picks a free port)."""
    app = web.Application()
    add_health_routes(app, ready, metrics=metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner


def bound_port(runner: web.AppRunner) -> int:
    """The TCP port a started runner listens on."""
    for address in runner.addresses:
        if isinstance(address, tuple):
            return int(address[1])
    return 0
