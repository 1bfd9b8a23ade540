"""``relay-row-worker``: read settings, build the router, bus and runner, run."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Awaitable

from relay_batches.bus.client import Bus
from relay_batches.bus.topology import MAX_QUEUE_NAME_BYTES, rows_prefetch
from relay_batches.ids import new_id
from relay_batches.ledger.answered import answered_rows
from relay_batches.ledger.pool import create_pool
from relay_batches.ratelimit.keeper import Keeper
from relay_batches.ratelimit.limiter import SharedLimiter
from relay_batches.ratelimit.parts import rate_limit_parts
from relay_batches.router.aliases import AliasTable, load_aliases
from relay_batches.router.cooldown import CooldownPolicy, Cooldowns
from relay_batches.router.http1 import Http1Client
from relay_batches.router.policy import BackoffPolicy
from relay_batches.router.router import ModelRouter
from relay_batches.runtime import Service, run_service
from relay_batches.services.row_worker.controls import JobControls
from relay_batches.services.row_worker.core import RowRunner
from relay_batches.services.row_worker.holdings import Holdings
from relay_batches.services.row_worker.outcomes import OutcomePublisher
from relay_batches.services.row_worker.paid_once import AnsweredRows, PaidOnce
from relay_batches.services.row_worker.service import (
    hand_over_priority,
    holding_heartbeat,
    outcome_batch_rows,
    row_worker_service,
)
from relay_batches.services.row_worker.traced import row_spans
from relay_batches.settings import ConfigError, Settings
from relay_batches.tracing import current_traceparent
from relay_batches.usage import answer_help
from relay_batches.wiring import open_bus

# One query per slice that comes back: one connection, opened on demand and closed once
# idle, so a fleet of workers holds none at rest.
LEDGER_POOL_SIZE = 1
LEDGER_IDLE_S = 10.0


async def build(
    settings: Settings, log: logging.Logger, resources: contextlib.AsyncExitStack
) -> Service:
    """Build the row-worker from settings (routes are validated here, before any work)."""
    aliases = load_aliases(settings.routes_file, os.environ)
    bus = await open_bus(settings, resources, "row-worker")
    worker = f"row-worker-{new_id()[:12]}"
    client = Http1Client()
    resources.push_async_callback(client.close)
    keeper, limiter = shared_limits(aliases, bus, worker)
    router = ModelRouter(
        aliases,
        client,
        BackoffPolicy(settings.retry_base_ms / 1000, settings.retry_cap_s),
        cooldowns=Cooldowns(
            CooldownPolicy(
                settings.cooldown_failures, settings.cooldown_window_s, settings.cooldown_s
            )
        ),
        limiter=limiter,
    )

    def publish_results(shard: int, body: bytes) -> Awaitable[None]:
        return bus.publish(bus.names.results_shard(shard), body, kind="results")

    outcomes = OutcomePublisher(
        publish_results,
        max_rows=outcome_batch_rows(
            settings.results_flush_rows, settings.batch_concurrency, settings.slice_rows
        ),
        flush_s=settings.results_flush_ms / 1000,
        max_bytes=settings.results_message_bytes,
        shards=bus.names.shards,
    )
    holdings = Holdings(worker, settings.heartbeat_seconds, settings.batch_concurrency)
    answered = AnsweredRows()
    runner = RowRunner(
        router,
        answered.sink(outcomes.add),
        settings.batch_concurrency,
        holdings,
        prices=aliases.prices(),
        references=aliases.realtime_references(),
        flush=outcomes.flush_job,
        hand_over=lambda rest: bus.publish(
            bus.names.rows,
            rest.encode(),
            kind="rows",
            priority=hand_over_priority(rest.level),
            trace=current_traceparent(),  # the slice's own, handed on with its rows
        ),
        controls=JobControls(publish_results, bus.names.shards),
        spans=row_spans(aliases),
    )
    # Read-only, for redelivered and re-sent slices only; opened lazily (min size 0): a
    # row-worker starts, and runs first sends, with the ledger away.
    ledger = await create_pool(
        settings.database_url,
        min_size=0,
        max_size=LEDGER_POOL_SIZE,
        max_inactive_s=LEDGER_IDLE_S,
        statement_cache_size=settings.db_statement_cache_size,
    )
    resources.push_async_callback(ledger.close)
    paid_once = PaidOnce(
        runner.handle_slice,
        answered,
        lambda batch_id, indexes: answered_rows(ledger, batch_id, indexes),
        wait_s=settings.redelivery_wait_s,
    )
    prefetch = rows_prefetch(settings.batch_concurrency, settings.slice_rows)
    log.info(
        "configured",
        extra={
            "aliases": aliases.names(),
            "prefetch": prefetch,
            "rate_limited": sorted(aliases.limits()),
        },
    )
    return row_worker_service(
        bus,
        runner,
        outcomes,
        prefetch=prefetch,
        grace_s=settings.shutdown_grace_s,
        heartbeat=holding_heartbeat(holdings, bus.publish_event, settings.heartbeat_seconds),
        keeper=keeper,
        ratelimit=rate_limit_parts(keeper, limiter),
        paid_once=paid_once,
    )


def shared_limits(
    aliases: AliasTable, bus: Bus, worker: str = ""
) -> tuple[Keeper | None, SharedLimiter | None]:
    """The keeper and limiter of the routes' rate-limited deployments (none: neither, and
    nothing of them runs); the keeper steps down the moment the bus connection drops.
    A deployment whose grants queue name would be too long for AMQP is a ConfigError."""
    limits = aliases.limits()
    if not limits:
        return None, None
    for name in limits:
        queue = bus.names.ratelimit_grants(name)
        if len(queue.encode()) > MAX_QUEUE_NAME_BYTES:
            raise ConfigError(
                f"deployment {name!r} is rate-limited but its grants queue name {queue!r} is "
                f"over {MAX_QUEUE_NAME_BYTES} bytes: use a shorter deployment name (or namespace)"
            )
    limiter = SharedLimiter(bus, limits)
    keeper = Keeper(bus, limits, tokens_per_call=limiter.typical_tokens, ident=worker)
    limiter.apply_throttles(keeper.throttle)
    bus.on_connection_lost(keeper.step_down)
    return keeper, limiter


def main() -> None:
    """Console entry point."""
    answer_help("relay-row-worker", "Calls the model for each row and publishes the outcomes.")
    run_service("row-worker", build)


if __name__ == "__main__":
    main()
