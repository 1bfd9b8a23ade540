"""Process runtime: signals → stop event → grace period → hard deadline → exit code.

A service is any object with ``async run(stop: asyncio.Event)`` that returns once it has
drained after ``stop`` is set, and ``ready() -> bool`` for ``/readyz``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from relay_batches.health import bound_port, start_health_server
from relay_batches.metrics import service_registry
from relay_batches.reach import EXIT_UNREACHABLE, Unreachable
from relay_batches.settings import ConfigError, Settings
from relay_batches.tracing import setup_tracing

# After the grace period a service has this long to cancel what is left and close, then
# the process exits 1 (Kubernetes' terminationGracePeriodSeconds must cover both).
HARD_DEADLINE_MARGIN_S = 5.0


class Service(Protocol):
    """What :func:`run_service` runs."""

    async def run(self, stop: asyncio.Event) -> None:
        """Work until ``stop`` is set, then drain and return."""

    async def ready(self) -> bool:
        """True while the service's connections are up and its consumers registered."""


ServiceFactory = Callable[[Settings, logging.Logger, contextlib.AsyncExitStack], Awaitable[Service]]


async def _serve(
    factory: ServiceFactory, settings: Settings, log: logging.Logger, metrics: CollectorRegistry
) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with contextlib.AsyncExitStack() as resources:
        return await _run(factory, settings, log, stop, resources, metrics)


async def _run(
    factory: ServiceFactory,
    settings: Settings,
    log: logging.Logger,
    stop: asyncio.Event,
    resources: contextlib.AsyncExitStack,
    metrics: CollectorRegistry,
) -> int:
    service = await factory(settings, log, resources)
    runner = await start_health_server(
        settings.health_host, settings.health_port, service.ready, metrics
    )
    log.info("health_listening", extra={"port": bound_port(runner)})
    task = asyncio.create_task(service.run(stop), name="service-run")
    stop_wait = asyncio.create_task(stop.wait(), name="stop-wait")
    try:
        await asyncio.wait({task, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            log.info("stopping", extra={"grace_s": settings.shutdown_grace_s})
            try:
                deadline_s = settings.shutdown_grace_s + HARD_DEADLINE_MARGIN_S
                await asyncio.wait_for(asyncio.shield(task), deadline_s)
            except TimeoutError:
                log.error("shutdown_deadline_passed")
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                return 1
        task.result()
        return 0
    finally:
        stop_wait.cancel()
        await runner.cleanup()


def run_loop(main: Coroutine[Any, Any, int], event_loop: str) -> int:
    """Run ``main`` on uvloop (the default: less CPU per message and request) or asyncio."""
    if event_loop == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def run_service(name: str, factory: ServiceFactory, *, env: dict[str, str] | None = None) -> None:
    """Entry point body for ``relay-<name>``: read settings, set up logging and tracing
    (:mod:`relay_batches.tracing`: off unless ``OTEL_*`` turns it on), run, exit (2 on a
    configuration error, or when Postgres or RabbitMQ cannot be reached at
    start-up: one line on stderr)."""
    from relay_batches.logging import setup_logging

    try:
        settings = Settings.from_env(env)
        stop_tracing = setup_tracing(name, os.environ if env is None else env)
    except ConfigError as exc:
        print(f"relay-{name}: configuration error: {exc}", file=sys.stderr)
        sys.exit(2)
    log = setup_logging(name, settings.log_level)
    shown = {"settings": settings.describe()} if settings.log_settings == "full" else {}
    log.info("starting", extra=shown)
    if stop_tracing is not None:
        log.info("tracing_on")  # OTEL_* turned traces on (docs/operations/tracing.md)
    try:
        code = run_loop(_serve(factory, settings, log, service_registry(name)), settings.event_loop)
    except ConfigError as exc:
        print(f"relay-{name}: configuration error: {exc}", file=sys.stderr)
        sys.exit(2)
    except Unreachable as exc:
        # Postgres or RabbitMQ away at start-up: one line naming the variable, no traceback.
        print(f"relay-{name}: {exc.line()}", file=sys.stderr)
        sys.exit(EXIT_UNREACHABLE)
    except Exception as exc:
        log.exception("crashed", extra={"error": repr(exc)})
        print(f"relay-{name}: stopped by an error: {exc!r}", file=sys.stderr)
        sys.exit(1)
    log.info("stopped", extra={"exit_code": code})
    if stop_tracing is not None:
        stop_tracing()  # the spans still queued go out before the process does
    sys.exit(code)
