"""``relay-upstream-sim``: read ``RELAY_SIM_*`` from the environment and serve the simulator.

The variables (latency, error rate, rate limits, provider batch delays, host and port) are
declared in :class:`relay_batches.settings.SimSettings` and listed, with their defaults and
bounds, in docs/operations/configuration.md. A bad value exits 2; SIGTERM or SIGINT stops
the server and exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields

import uvloop
from aiohttp import web

from relay_batches.logging import setup_logging
from relay_batches.services.upstream_sim.app import build_app
from relay_batches.services.upstream_sim.config import SimConfig
from relay_batches.settings import ConfigError, SimSettings
from relay_batches.usage import answer_help

SERVICE = "upstream-sim"
LISTENER = ("host", "port")  # the settings that are not SimConfig's
SHUTDOWN_GRACE_S = 1.0  # in-flight calls get this long after a signal; hung ones are cut


@dataclass(frozen=True)
class SimOptions:
    """Everything the simulator process is configured with."""

    config: SimConfig
    host: str = "127.0.0.1"
    port: int = 8090


def options_from_env(env: Mapping[str, str]) -> SimOptions:
    """Read the ``RELAY_SIM_*`` variables; raise :class:`ConfigError` on a bad value."""
    read = SimSettings.from_env(env)
    # Every setting but the listener is a SimConfig field of the same name.
    given = {f.name: getattr(read, f.name) for f in fields(read) if f.name not in LISTENER}
    return SimOptions(config=SimConfig(**given), host=read.host, port=read.port)


async def serve(options: SimOptions, log: logging.Logger) -> None:
    """Serve until SIGTERM or SIGINT, then close the listener and in-flight calls."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(
        build_app(options.config),
        access_log=None,
        handler_cancellation=True,
        shutdown_timeout=SHUTDOWN_GRACE_S,
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, options.host, options.port).start()
        port = runner.addresses[0][1]
        log.info("started", extra={"host": options.host, "port": port})
        await stop.wait()
    finally:
        await runner.cleanup()
    log.info("stopped")


def main() -> None:
    """Entry point of ``relay-upstream-sim``."""
    answer_help(
        "relay-upstream-sim",
        "A local OpenAI-compatible model for development and tests (RELAY_SIM_*).",
    )
    try:
        options = options_from_env(os.environ)
    except ConfigError as exc:
        print(f"relay-{SERVICE}: configuration error: {exc}", file=sys.stderr)
        sys.exit(2)
    log = setup_logging(SERVICE)
    try:
        # uvloop: the simulator stands in for a provider whose CPU is not ours, so it should
        # take as little of this machine's CPU as it can.
        uvloop.run(serve(options, log))
    except OSError as exc:
        log.error(
            "listen_failed", extra={"host": options.host, "port": options.port, "error": str(exc)}
        )
        sys.exit(1)
    sys.exit(0)


if __name__ == "__main__":
    main()
