"""``relay-notifier``: read settings, open the pool, bus and HTTP client, deliver."""

from __future__ import annotations

import contextlib
import logging

import aiohttp

from notifier.service import NotifierService, http_poster
from relay.ledger.deliveries import DeliveryStore
from relay.ledger.pool import database_ready
from relay.runtime import Service, run_service
from relay.settings import Settings
from relay.wiring import open_bus, open_pool

CLAIM_MARGIN_S = 20.0


async def build(
    settings: Settings, log: logging.Logger, resources: contextlib.AsyncExitStack
) -> Service:
    """Build the notifier from settings."""
    pool = await open_pool(settings, resources, max_size=4)
    bus = await open_bus(settings, resources, "notifier")
    session = aiohttp.ClientSession()
    resources.push_async_callback(session.close)
    post = http_poster(session, settings.webhook_timeout_s)
    # A claim outlives any POST (bounded by the webhook timeout) by a wide margin.
    store = DeliveryStore(pool, claim_s=settings.webhook_timeout_s + CLAIM_MARGIN_S)
    return NotifierService(
        bus,
        store,
        post,
        lambda: database_ready(pool),
        recover_every_s=settings.reconcile_seconds,
        grace_s=settings.shutdown_grace_s,
    )


def main() -> None:
    """Console entry point."""
    run_service("notifier", build)


if __name__ == "__main__":
    main()
