"""``relay-notifier``: read settings, open the pool, bus and HTTP client, deliver."""

from __future__ import annotations

import contextlib
import logging

from relay_batches.ledger.deliveries import DeliveryStore
from relay_batches.ledger.schema import ledger_readiness
from relay_batches.runtime import Service, run_service
from relay_batches.services.notifier.core import claim_seconds
from relay_batches.services.notifier.http import guarded_poster
from relay_batches.services.notifier.service import notifier_service
from relay_batches.settings import Settings
from relay_batches.usage import answer_help
from relay_batches.wiring import open_bus, open_pool


async def build(
    settings: Settings, log: logging.Logger, resources: contextlib.AsyncExitStack
) -> Service:
    """Build the notifier from settings."""
    pool = await open_pool(settings, resources, max_size=4)
    bus = await open_bus(settings, resources, "notifier")
    post = guarded_poster(settings.webhook_allow_networks, settings.webhook_timeout_s)
    if settings.webhook_allow_networks:
        log.warning(
            "webhook_allow_list",
            extra={"networks": [str(n) for n in settings.webhook_allow_networks]},
        )
    # A claim outlives a whole delivery: POST, then recording it (see claim_seconds).
    store = DeliveryStore(pool, claim_s=claim_seconds(settings.webhook_timeout_s))
    return notifier_service(
        bus,
        store,
        post,
        ledger_readiness(pool),
        recover_every_s=settings.reconcile_seconds,
        grace_s=settings.shutdown_grace_s,
        # Behind the receiver's slots, waiting out about two POSTs that time out.
        receiver_wait_s=2 * settings.webhook_timeout_s,
        retry_base_s=settings.webhook_retry_base_s,
    )


def main() -> None:
    """Console entry point."""
    answer_help(
        "relay-notifier",
        "POSTs each finished job's completion webhook, once, and its event to the"
        " workspace's webhook endpoints.",
    )
    run_service("notifier", build)


if __name__ == "__main__":
    main()
