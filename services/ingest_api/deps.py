"""The ingest-api's wiring: what every handler uses, built once in ``__main__``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property

import asyncpg
from aiohttp import web

from relay_batches.ledger.delivery_log import DeliveryLog
from relay_batches.ledger.files import FileStore
from relay_batches.ledger.idempotency import IdempotencyStore
from relay_batches.ledger.jobs import JobStore
from relay_batches.ledger.webhook_endpoints import WebhookEndpoints
from relay_batches.model import Job
from relay_batches.netguard import UrlGuard
from relay_batches.router.aliases import AliasTable
from relay_batches.services.ingest_api.edge.body import BodyGate
from relay_batches.services.ingest_api.fleet import Fleet
from relay_batches.services.ingest_api.rows.validation import (
    SubmitLimits,
)


@dataclass(frozen=True)
class Announcer:
    """The bus side-effects of the API (each awaits a confirm)."""

    wake_dispatcher: Callable[[Job], Awaitable[None]]
    job_canceled: Callable[[Job], Awaitable[None]]
    template_created: Callable[[Job], Awaitable[None]]
    job_paused: Callable[[Job], Awaitable[None]]  # job.progress, status paused


@dataclass(frozen=True)
class ApiDeps:
    """Everything the handlers use, built once in ``__main__``."""

    jobs: JobStore
    idempotency: IdempotencyStore
    announcer: Announcer
    model_known: Callable[[str], bool]
    limits: SubmitLimits
    max_body_bytes: int  # uploads (spooled to disk)
    max_json_body_bytes: int  # JSON bodies (decoded in memory): at most max_body_bytes
    files: FileStore  # the OpenAI surface's files and batch links
    pool: asyncpg.Pool  # the ledger, for the stores a surface builds on it
    model_names: Callable[[], list[str]] = list  # the router's public aliases
    aliases: AliasTable | None = None  # the routes file (the estimate prices its lanes)
    # When the routes were loaded (the routes file's modification time): the models'
    # creation time on the OpenAI and Anthropic surfaces' ``GET /models``.
    routes_loaded_at: datetime = datetime(1970, 1, 1, tzinfo=UTC)
    # RELAY_PUBLIC_BASE_URL: the root of the URLs handed out (results_url); empty for
    # the request's own origin.
    public_base_url: str = ""
    body_gate: BodyGate = field(default_factory=BodyGate)  # stall timeout, large bodies
    spool_dir: str | None = None  # where uploads are spooled; None: the system temp dir
    # The row-workers, queues and throttles of GET /v1/workers (None: not listening).
    fleet: Fleet | None = None
    # The SSRF guard a webhook endpoint's URL must pass when it is created (the
    # notifier applies it again at every POST).
    url_guard: UrlGuard = field(default_factory=UrlGuard)
    # Decoding and validating large bodies, one at a time: each thread more would take
    # GIL time from the event loop without adding throughput. Small bodies have their
    # own thread, so they never queue behind a large one's seconds of parsing.
    parser: Executor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="ingest-parse")
    )
    small_parser: Executor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="ingest-parse-small")
    )

    @cached_property
    def delivery_log(self) -> DeliveryLog:
        """Completion-webhook delivery logs and redeliveries, on :attr:`pool`."""
        return DeliveryLog(self.pool)

    @cached_property
    def webhook_endpoints(self) -> WebhookEndpoints:
        """The workspaces' webhook endpoints, on :attr:`pool`."""
        return WebhookEndpoints(self.pool)

    def parser_for(self, large: bool) -> Executor:
        """The executor that decodes and validates a body (large or not)."""
        return self.parser if large else self.small_parser


DEPS = web.AppKey("deps", ApiDeps)
