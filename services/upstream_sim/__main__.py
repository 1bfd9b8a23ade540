"""``relay-upstream-sim``: read ``RELAY_SIM_*`` from the environment and serve the simulator.

``RELAY_SIM_LATENCY_MS`` (default 0), ``RELAY_SIM_ERROR_RATE`` (fraction 0..1, default 0),
``RELAY_SIM_RPM`` and ``RELAY_SIM_TPM`` (rate limits enforced per second, default 0: off),
``RELAY_SIM_BATCH_DELAY_S`` (seconds a provider batch takes at least, default 0: done at its
first poll), ``RELAY_SIM_BATCH_INPUT_DELAY_S`` (seconds a batch input, upload or create,
waits for its answer, default 0) and ``RELAY_SIM_BATCH_RESULTS_PAUSE_S`` (seconds a results
download stops halfway, default 0),
``RELAY_SIM_HOST`` (default 127.0.0.1) and ``RELAY_SIM_PORT`` (default 8090; 0 picks a
free port). A bad value exits 2; SIGTERM or SIGINT stops the server and exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass

import uvloop
from aiohttp import web

from relay_batches.logging import setup_logging
from relay_batches.services.upstream_sim.app import build_app
from relay_batches.services.upstream_sim.config import SimConfig
from relay_batches.settings import ConfigError, port_setting
from relay_batches.usage import answer_help

SERVICE = "upstream-sim"
SHUTDOWN_GRACE_S = 1.0  # in-flight calls get this long after a signal; hung ones are cut


@dataclass(frozen=True)
class SimOptions:
    """Everything the simulator process is configured with."""

    config: SimConfig
    host: str = "127.0.0.1"
    port: int = 8090


def _number(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None
    if not low <= value <= high:
        raise ConfigError(f"{name} must be within {low:g}..{high:g}, got {raw!r}")
    return value


def options_from_env(env: Mapping[str, str]) -> SimOptions:
    """Read the ``RELAY_SIM_*`` variables; raise :class:`ConfigError` on a bad value."""
    config = SimConfig(
        latency_ms=_number(env, "RELAY_SIM_LATENCY_MS", 0.0, 0.0, 3_600_000.0),
        error_rate=_number(env, "RELAY_SIM_ERROR_RATE", 0.0, 0.0, 1.0),
        rpm=int(_number(env, "RELAY_SIM_RPM", 0, 0, 1e9)),
        tpm=int(_number(env, "RELAY_SIM_TPM", 0, 0, 1e12)),
        batch_delay_s=_number(env, "RELAY_SIM_BATCH_DELAY_S", 0.0, 0.0, 86_400.0),
        batch_input_delay_s=_number(env, "RELAY_SIM_BATCH_INPUT_DELAY_S", 0.0, 0.0, 3_600.0),
        batch_results_pause_s=_number(env, "RELAY_SIM_BATCH_RESULTS_PAUSE_S", 0.0, 0.0, 3_600.0),
    )
    host = env.get("RELAY_SIM_HOST", "").strip() or "127.0.0.1"
    return SimOptions(config=config, host=host, port=port_setting(env, "RELAY_SIM_PORT", 8090))


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
