"""``relay-offloader``: read settings and routes, open the pool, bus and HTTP session,
build a client per batch deployment, run the offload passes."""

from __future__ import annotations

import contextlib
import logging
import os

import aiohttp

from relay_batches.dialects.anthropic.batch_api import AnthropicBatches
from relay_batches.dialects.openai.batch_api import OpenAIBatches
from relay_batches.ids import new_id
from relay_batches.ledger.offload import OffloadStore
from relay_batches.ledger.schema import ledger_readiness
from relay_batches.messages import SliceMessage
from relay_batches.offload.lines import BatchClient
from relay_batches.router.aliases import AliasTable, load_aliases
from relay_batches.runtime import Service, run_service
from relay_batches.services.offloader.core import OffloadConfig, Offloader
from relay_batches.services.offloader.service import POOL_SIZE, offloader_service
from relay_batches.settings import Settings
from relay_batches.usage import answer_help
from relay_batches.wiring import open_bus, open_pool


def batch_clients(aliases: AliasTable, session: aiohttp.ClientSession) -> dict[str, BatchClient]:
    """A provider client for every batch deployment of the routes, by name."""
    clients: dict[str, BatchClient] = {}
    for name, deployment in aliases.batch_deployments().items():
        if deployment.provider == "openai-batch":
            clients[name] = OpenAIBatches(deployment, session)
        else:
            clients[name] = AnthropicBatches(deployment, session)
    return clients


async def build(
    settings: Settings, log: logging.Logger, resources: contextlib.AsyncExitStack
) -> Service:
    """Build the offloader from settings (routes are validated here, before any work)."""
    aliases = load_aliases(settings.routes_file, os.environ)
    pool = await open_pool(settings, resources, max_size=POOL_SIZE)
    bus = await open_bus(settings, resources, "offloader")
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16))
    resources.push_async_callback(session.close)
    owner = f"offloader-{new_id()[:12]}"

    async def publish_outcomes(shard: int, body: bytes) -> None:
        await bus.publish(bus.names.results_shard(shard), body, kind="results")

    async def publish_slice(job_slice: SliceMessage) -> None:
        await bus.publish(bus.names.rows, job_slice.encode(), kind="rows", priority=job_slice.level)

    clients = batch_clients(aliases, session)
    offloader = Offloader(
        OffloadStore(pool),
        aliases,
        clients,
        publish_outcomes,
        publish_slice,
        OffloadConfig(
            owner,
            lease_s=settings.lease_seconds,
            shards=bus.names.shards,
            margin_s=settings.offload_margin.total_seconds(),
            group_prefixes=settings.prefix_grouping == "on",
        ),
    )
    log.info("configured", extra={"owner": owner, "batch_deployments": sorted(clients)})
    return offloader_service(
        bus,
        offloader,
        ledger_readiness(pool),
        every_s=settings.offload_interval_s,
        grace_s=settings.shutdown_grace_s,
    )


def main() -> None:
    """Console entry point."""
    answer_help(
        "relay-offloader",
        "Runs the rows of offloaded jobs through the providers' batch APIs, and the rows"
        " they do not answer on realtime deployments.",
    )
    run_service("offloader", build)


if __name__ == "__main__":
    main()
