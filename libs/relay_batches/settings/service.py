"""The services' settings: every ``RELAY_*`` variable a Relay service reads, each declared
once below (variable, kind, default, section, readers, what it does).

Only a service's ``__main__`` calls :meth:`Settings.from_env`; everything else receives
the object (or the values it needs) as arguments.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from relay_batches.netguard import IPNetwork
from relay_batches.prefixes import GROUPING
from relay_batches.settings.declare import (
    AGGREGATOR,
    CAPACITY,
    DISPATCHER,
    ESSENTIALS,
    INGEST_API,
    LEDGER_SERVICES,
    LIMITS,
    NOTIFIER,
    OFFLOADER,
    RELAY,
    RELAY_DEV,
    ROW_WORKER,
    SCHEDULER,
    SERVICES,
    TUNING,
    UPSTREAM,
    describe,
    load,
    setting,
)
from relay_batches.settings.kinds import (
    BaseUrl,
    Choice,
    ConfigError,
    Duration,
    Int,
    Namespace,
    Networks,
    Number,
    Port,
    Shards,
    Text,
    Url,
)

ALL = SERVICES
POSITIVE = Number(positive=True)
FINITE = Number(finite=True)
AT_LEAST_ONE = Int(low=1)  # a clamp: below 1 reads as 1
ONE_OR_MORE = Int(low=1, clamp=False)  # below 1 is refused
BYTES = Int(low=1, unit="bytes")


@dataclass(frozen=True)
class Settings:
    """All configuration of a Relay process. Defaults work on a developer machine."""

    database_url: str = setting(
        "RELAY_DATABASE_URL", Url(), "postgresql://postgres@127.0.0.1:5432/relay",
        ESSENTIALS, (*SERVICES, RELAY, RELAY_DEV),
        "The ledger: a Postgres connection URL (a row-worker only reads which rows of a "
        "redelivered slice have an outcome); with a standby, every host and "
        "`target_session_attrs=read-write` (`postgresql://u@db-1:5432,db-2:5432/relay"
        "?target_session_attrs=read-write`): connections go to whichever is primary.",
    )  # fmt: skip
    amqp_url: str = setting(
        "RELAY_AMQP_URL", Url(), "amqp://guest:guest@127.0.0.1:5672/", ESSENTIALS, ALL,
        "The broker: a RabbitMQ URL (`amqps://` for TLS), or one per node of a cluster, "
        "comma-separated: a service whose node goes moves to the next one.",
    )  # fmt: skip
    namespace: str = setting(
        "RELAY_NAMESPACE", Namespace(), "relay", ESSENTIALS, ALL,
        "Prefix of every queue and exchange name: deployments sharing a broker apart.",
    )  # fmt: skip
    routes_file: str = setting(
        "RELAY_ROUTES_FILE", Text(), "deploy/routes.local.toml", ESSENTIALS,
        (INGEST_API, DISPATCHER, ROW_WORKER, OFFLOADER, RELAY_DEV),
        "The model routes (TOML): aliases, deployments, providers and their key variables.",
    )  # fmt: skip
    api_host: str = setting(
        "RELAY_API_HOST", Text(), "127.0.0.1", ESSENTIALS, (INGEST_API, RELAY_DEV),
        "Address the ingest-api listens on (`0.0.0.0` in a container).",
    )  # fmt: skip
    api_port: int = setting(
        "RELAY_API_PORT", Port(), 8080, ESSENTIALS, (INGEST_API, RELAY_DEV),
        "Port the ingest-api listens on.",
    )  # fmt: skip
    health_host: str = setting(
        "RELAY_HEALTH_HOST", Text(), "127.0.0.1", ESSENTIALS, (*ALL, RELAY_DEV),
        "Address of every service's health and metrics listener.",
    )  # fmt: skip
    health_port: int = setting(
        "RELAY_HEALTH_PORT", Port(), 0, ESSENTIALS, (*ALL, RELAY_DEV),
        "Port of that listener (`/healthz`, `/readyz`, `/metrics`), logged at start; under "
        "`relay dev` the first of consecutive ones.",
    )  # fmt: skip
    batch_concurrency: int = setting(
        "RELAY_BATCH_CONCURRENCY", Int(1, 32), 4, CAPACITY, (ROW_WORKER,),
        "Rows a row-worker has in flight at once.",
    )  # fmt: skip
    slice_rows: int = setting(
        "RELAY_SLICE_ROWS", Int(1, 1000), 64, TUNING, (DISPATCHER, ROW_WORKER),
        "Consecutive rows per slice message; set it alike for dispatchers and row-workers.",
    )  # fmt: skip
    dispatch_window: int = setting(
        "RELAY_DISPATCH_WINDOW", AT_LEAST_ONE, 1024, TUNING, (DISPATCHER,),
        "Unfinished rows of one workspace in the broker per dispatcher (the base window).",
    )  # fmt: skip
    dispatch_window_bytes: int = setting(
        "RELAY_DISPATCH_WINDOW_BYTES", BYTES, 16 * 1024 * 1024, TUNING, (DISPATCHER,),
        "And at most this many bytes of them (the base byte window).",
    )  # fmt: skip
    dispatch_window_max: int = setting(
        "RELAY_DISPATCH_WINDOW_MAX", AT_LEAST_ONE, 65536, TUNING, (DISPATCHER,),
        "Rows a dispatcher's window may grow to in total as row-workers are added.",
    )  # fmt: skip
    dispatch_window_max_bytes: int = setting(
        "RELAY_DISPATCH_WINDOW_MAX_BYTES", BYTES, 256 * 1024 * 1024, TUNING, (DISPATCHER,),
        "Bytes a dispatcher's byte window may grow to in total.",
    )  # fmt: skip
    max_running_jobs: int = setting(
        "RELAY_MAX_RUNNING_JOBS", AT_LEAST_ONE, 64, CAPACITY, (DISPATCHER,),
        "Running slots of one dispatcher, shared round the workspaces.",
    )  # fmt: skip
    max_running_jobs_per_workspace: int = setting(
        "RELAY_MAX_RUNNING_JOBS_PER_WORKSPACE", Int(low=0), 0, CAPACITY, (DISPATCHER,),
        "Running jobs of one workspace across all dispatchers (`0`: no cap).",
    )  # fmt: skip
    lease_seconds: float = setting(
        "RELAY_LEASE_SECONDS", POSITIVE, 30.0, TUNING, (DISPATCHER, OFFLOADER),
        "Seconds a dispatcher's (or offloader's) lease on a job lasts; an expired one is "
        "taken over.",
    )  # fmt: skip
    reconcile_seconds: float = setting(
        "RELAY_RECONCILE_SECONDS", POSITIVE, 2.0, TUNING, (DISPATCHER, AGGREGATOR, NOTIFIER),
        "Interval of the dispatcher's claim scan, the aggregator's outbox scan and the "
        "notifier's takeover pass.",
    )  # fmt: skip
    redelivery_wait_s: float = setting(
        "RELAY_REDELIVERY_WAIT_S", POSITIVE, 4.0, TUNING, (ROW_WORKER,),
        "How long a row-worker waits before asking the ledger which rows of a slice that "
        "came back have an outcome (its former holder's answers on their way); on a broker "
        "cluster, above the results queues' leader election (10 s).",
    )  # fmt: skip
    results_flush_ms: float = setting(
        "RELAY_RESULTS_FLUSH_MS", POSITIVE, 25.0, TUNING, (ROW_WORKER,),
        "Longest a row-worker holds a shard's outcomes while more are arriving fast.",
    )  # fmt: skip
    results_flush_rows: int = setting(
        "RELAY_RESULTS_FLUSH_ROWS", AT_LEAST_ONE, 64, TUNING, (ROW_WORKER,),
        "Outcomes that make a row-worker publish a shard's message at once.",
    )  # fmt: skip
    results_message_bytes: int = setting(
        "RELAY_RESULTS_MESSAGE_BYTES", Int(low=1024, unit="bytes"), 256 * 1024, TUNING,
        (ROW_WORKER,),
        "Largest outcome message (one larger outcome travels alone); bounds an aggregator's "
        "memory.",
    )  # fmt: skip
    results_dead_max_length: int = setting(
        "RELAY_RESULTS_DEAD_MAX_LENGTH", AT_LEAST_ONE, 10_000, CAPACITY, ALL,
        "Messages `<ns>.results.dead` keeps, oldest dropped first; a queue argument: alike "
        "in every service.",
    )  # fmt: skip
    # The type of the durable queues that may be quorum queues (results, notify; see
    # Names.quorum_capable). dispatch and rows stay classic.
    queue_type: str = setting(
        "RELAY_QUEUE_TYPE", Choice(("classic", "quorum")), "classic", CAPACITY, ALL,
        "Type of the results and notify queues; a queue argument: alike in every service.",
    )  # fmt: skip
    results_shards: int = setting(
        "RELAY_RESULTS_SHARDS", Int(1, 64), 4, CAPACITY, ALL,
        "Results shard queues; alike in every service of a namespace.",
    )  # fmt: skip
    aggregator_shards: tuple[int, ...] = setting(
        "RELAY_AGGREGATOR_SHARDS", Shards("RELAY_RESULTS_SHARDS"), (), CAPACITY, (AGGREGATOR,),
        "The shards this aggregator consumes (`0,2`), to spread them over replicas.",
        default_doc="every shard",
    )  # fmt: skip
    aggregator_chunk: int = setting(
        "RELAY_AGGREGATOR_CHUNK", AT_LEAST_ONE, 64, TUNING, (AGGREGATOR,),
        "Outcome messages per ledger transaction when quiet.",
    )  # fmt: skip
    aggregator_chunk_max: int = setting(
        "RELAY_AGGREGATOR_CHUNK_MAX", AT_LEAST_ONE, 256, TUNING, (AGGREGATOR,),
        "Outcome messages per ledger transaction at most, under load.",
    )  # fmt: skip
    aggregator_prefetch: int = setting(
        "RELAY_AGGREGATOR_PREFETCH", AT_LEAST_ONE, 256, TUNING, (AGGREGATOR,),
        "Unacked outcome messages an aggregator holds, shared over the queues it consumes.",
    )  # fmt: skip
    aggregator_chunk_bytes: int = setting(
        "RELAY_AGGREGATOR_CHUNK_BYTES", BYTES, 16 * 1024 * 1024, TUNING, (AGGREGATOR,),
        "Bytes of message bodies per ledger transaction at most.",
    )  # fmt: skip
    aggregator_linger_ms: float = setting(
        "RELAY_AGGREGATOR_LINGER_MS", Number(), 20.0, TUNING, (AGGREGATOR,),
        "Longest wait for more messages after a chunk's first one.",
    )  # fmt: skip
    webhook_timeout_s: float = setting(
        "RELAY_WEBHOOK_TIMEOUT_S", POSITIVE, 10.0, UPSTREAM, (NOTIFIER, INGEST_API),
        "Deadline of one webhook attempt (resolving the host and the whole POST), and of"
        " resolving a new webhook endpoint's host at the API.",
    )  # fmt: skip
    webhook_allow_networks: tuple[IPNetwork, ...] = setting(
        "RELAY_WEBHOOK_ALLOW_NETWORKS", Networks(), (), ESSENTIALS, (NOTIFIER, INGEST_API),
        "CIDRs webhooks may reach despite the guard against private addresses.",
        default_doc="none: public addresses only",
    )  # fmt: skip
    webhook_retry_base_s: float = setting(
        "RELAY_WEBHOOK_RETRY_BASE_S", FINITE, 30.0, UPSTREAM, (NOTIFIER,),
        "First wait of a workspace's automatic webhook retries (doubling, at most 1 h).",
    )  # fmt: skip
    retry_base_ms: float = setting(
        "RELAY_RETRY_BASE_MS", Number(), 200.0, UPSTREAM, (ROW_WORKER,),
        "Base of the upstream retry backoff: a retry waits up to base × 2^n.",
    )  # fmt: skip
    retry_cap_s: float = setting(
        "RELAY_RETRY_CAP_S", POSITIVE, 10.0, UPSTREAM, (ROW_WORKER,),
        "Longest upstream retry wait, `Retry-After` included.",
    )  # fmt: skip
    cooldown_failures: int = setting(
        "RELAY_COOLDOWN_FAILURES", AT_LEAST_ONE, 5, UPSTREAM, (ROW_WORKER,),
        "Transient failures within the window that put a deployment in cooldown.",
    )  # fmt: skip
    cooldown_window_s: float = setting(
        "RELAY_COOLDOWN_WINDOW_S", POSITIVE, 10.0, UPSTREAM, (ROW_WORKER,),
        "That window, in seconds.",
    )  # fmt: skip
    cooldown_s: float = setting(
        "RELAY_COOLDOWN_S", POSITIVE, 30.0, UPSTREAM, (ROW_WORKER,),
        "Seconds a deployment in cooldown is skipped (rows go to the next one).",
    )  # fmt: skip
    max_body_bytes: int = setting(
        "RELAY_MAX_BODY_BYTES", Int(low=1, clamp=False, unit="bytes"), 256 * 1024 * 1024,
        LIMITS, (INGEST_API,),
        "Largest request body after inflating, and largest OpenAI input file (413 above).",
    )  # fmt: skip
    # A JSON body is decoded whole in memory; an upload is spooled to disk.
    max_json_body_bytes: int = setting(
        "RELAY_MAX_JSON_BODY_BYTES",
        Int(low=1, clamp=False, at_most="RELAY_MAX_BODY_BYTES", unit="bytes"),
        100 * 1024 * 1024, LIMITS, (INGEST_API,),
        "Largest JSON body, decoded whole in memory; unset, it follows a lower body limit.",
    )  # fmt: skip
    max_rows: int = setting(
        "RELAY_MAX_ROWS", ONE_OR_MORE, 1_000_000, LIMITS, (INGEST_API,),
        "Rows per batch.",
    )  # fmt: skip
    max_content_bytes: int = setting(
        "RELAY_MAX_CONTENT_BYTES", Int(unit="bytes"), 1024 * 1024, LIMITS, (INGEST_API,),
        "Bytes of one message's `content`.",
    )  # fmt: skip
    max_row_bytes: int = setting(
        "RELAY_MAX_ROW_BYTES", Int(low=1, clamp=False, unit="bytes"), 8 * 1024 * 1024, LIMITS,
        (INGEST_API,),
        "Bytes of one row: a line of an uploaded file, a CSV record, a row in a body.",
    )  # fmt: skip
    results_page_bytes: int = setting(
        "RELAY_RESULTS_PAGE_BYTES", BYTES, 4 * 1024 * 1024, LIMITS, (INGEST_API,),
        "Bytes of results text read from the ledger per page: the memory of one reader.",
    )  # fmt: skip
    body_read_timeout_s: float = setting(
        "RELAY_BODY_READ_TIMEOUT_S", POSITIVE, 30.0, LIMITS, (INGEST_API,),
        "A body that sends no byte for this long is answered 408.",
    )  # fmt: skip
    body_min_rate: float = setting(
        "RELAY_BODY_MIN_RATE", POSITIVE, 64 * 1024, LIMITS, (INGEST_API,),
        "Bytes per second a body must average once the read timeout has passed, else 408.",
    )  # fmt: skip
    large_body_bytes: int = setting(
        "RELAY_LARGE_BODY_BYTES", BYTES, 1024 * 1024, LIMITS, (INGEST_API,),
        "A body over this size holds a large-body slot until answered.",
    )  # fmt: skip
    max_large_bodies: int = setting(
        "RELAY_MAX_LARGE_BODIES", AT_LEAST_ONE, 2, LIMITS, (INGEST_API,),
        "Large-body slots (at most one per workspace); past them, 503 with `Retry-After`.",
    )  # fmt: skip
    header_timeout_s: float = setting(
        "RELAY_HEADER_TIMEOUT_S", POSITIVE, 10.0, LIMITS, (INGEST_API,),
        "A new connection whose request line and headers are not complete this long after "
        "it opens is closed (bytes trickling in do not extend it).",
    )  # fmt: skip
    keepalive_s: float = setting(
        "RELAY_KEEPALIVE_S", POSITIVE, 75.0, LIMITS, (INGEST_API,),
        "How long a kept-alive connection may stay idle, or take over its next request's "
        "line and headers, after a response; keep it above the idle timeout of any proxy "
        "or load balancer that reuses connections to the API (or it may send a request on "
        "a connection being closed).",
    )  # fmt: skip
    max_connections: int = setting(
        "RELAY_MAX_CONNECTIONS", AT_LEAST_ONE, 10_000, LIMITS, (INGEST_API,),
        "Connections one ingest-api process holds open; past them, a new one is closed as "
        "it is accepted.",
    )  # fmt: skip
    upload_spool_dir: str | None = setting(
        "RELAY_UPLOAD_SPOOL_DIR", Text(), None, ESSENTIALS, (INGEST_API,),
        "Where uploaded files are received before they are stored; an existing writable "
        "directory.",
        default_doc="the system temporary directory",
    )  # fmt: skip
    shutdown_grace_s: float = setting(
        "RELAY_SHUTDOWN_GRACE_S", POSITIVE, 20.0, CAPACITY, ALL,
        "On SIGTERM, the time in-flight work gets before the rest is handed back.",
    )  # fmt: skip
    log_level: str = setting(
        "RELAY_LOG_LEVEL", Text(upper=True), "INFO", ESSENTIALS, ALL,
        "Level of the JSON logs on stdout (`DEBUG`, `INFO`, `WARNING`, `ERROR`).",
    )  # fmt: skip
    log_settings: str = setting(
        "RELAY_LOG_SETTINGS", Choice(("full", "none")), "full", ESSENTIALS, ALL,
        "What a service's `starting` log line carries: `full`, every setting (passwords"
        " masked); `none`, none (`make run` sets it unless `relay dev --verbose`).",
    )  # fmt: skip
    event_loop: str = setting(
        "RELAY_EVENT_LOOP", Choice(("uvloop", "asyncio")), "uvloop", CAPACITY, ALL,
        "The event loop every service runs on.",
    )  # fmt: skip
    stall_seconds: float = setting(
        "RELAY_STALL_SECONDS", POSITIVE, 120.0, TUNING, (DISPATCHER,),
        "A running job without a new outcome for this long has its lost rows re-sent.",
    )  # fmt: skip
    statistics_seconds: float = setting(
        "RELAY_STATISTICS_SECONDS", Number(), 5.0, TUNING, (DISPATCHER,),
        "Interval of the dispatcher's statistics keeper, which analyzes the ledger's row "
        "tables once Relay changed them enough since their last analyze (`0`: off).",
    )  # fmt: skip
    backlog_seconds: float = setting(
        "RELAY_BACKLOG_SECONDS", Number(), 5.0, TUNING, (DISPATCHER,),
        "Interval of the backlog gauges (`relay_backlog_*`): one dispatcher at a time (a "
        "lease in the ledger) reads the unfinished jobs' counters (`0`: off).",
    )  # fmt: skip
    heartbeat_seconds: float = setting(
        "RELAY_HEARTBEAT_SECONDS", POSITIVE, 2.0, TUNING, (ROW_WORKER,),
        "How often a row-worker reports the rows it holds (a report lasts 3× this).",
    )  # fmt: skip
    scheduler_max_sleep_s: float = setting(
        "RELAY_SCHEDULER_MAX_SLEEP_S", POSITIVE, 60.0, TUNING, (SCHEDULER,),
        "Longest scheduler sleep between looks at the ledger.",
    )  # fmt: skip
    expiry_interval_s: float = setting(
        "RELAY_EXPIRY_INTERVAL_S", FINITE, 1.0, TUNING, (SCHEDULER,),
        "How often the scheduler ends jobs past their `completion_window`.",
    )  # fmt: skip
    # How long an ended job is kept before the scheduler's retention reaper purges it
    # (a workspace may override it: workspaces.retention); and how often that reaper runs.
    retention: timedelta = setting(
        "RELAY_RETENTION", Duration(), timedelta(days=30), ESSENTIALS, (SCHEDULER,),
        "How long ended jobs are kept before they are purged (a workspace may override it).",
    )  # fmt: skip
    retention_interval_s: float = setting(
        "RELAY_RETENTION_INTERVAL_S", FINITE, 60.0, TUNING, (SCHEDULER,),
        "How often the retention reaper looks for jobs and idempotency records to purge.",
    )  # fmt: skip
    # Offload: a job runs on its alias's batch deployment only if it may wait the
    # provider's window plus this margin; how often the offloader's loops run.
    prefix_grouping: str = setting(
        "RELAY_PREFIX_GROUPING", Choice(GROUPING), "on", TUNING, (DISPATCHER, OFFLOADER),
        "Order each release of rows, and each page of a provider batch's input, so rows"
        " whose requests share a prefix go together (prompt-cache reads); `off` keeps"
        " the stored order.",
    )  # fmt: skip
    offload_margin: timedelta = setting(
        "RELAY_OFFLOAD_MARGIN", Duration(), timedelta(hours=1), TUNING,
        (OFFLOADER,),
        "A job's rows go into a provider batch only while its deadline leaves 1.5 times the"
        " batch deployment's expected turnaround plus this.",
    )  # fmt: skip
    offload_interval_s: float = setting(
        "RELAY_OFFLOAD_INTERVAL_S", FINITE, 1.0, TUNING, (OFFLOADER,),
        "How often each of the offloader's passes runs.",
    )  # fmt: skip
    # The API's public address (scheme://host[:port][/prefix]) for URLs it hands out
    # (an Anthropic batch's results_url); empty: the request's own origin (dev only:
    # behind a TLS-terminating proxy that origin is http://).
    public_base_url: str = setting(
        "RELAY_PUBLIC_BASE_URL", BaseUrl(), "", ESSENTIALS, (INGEST_API,),
        "The API's public address, root of the URLs it hands out (`results_url`).",
        default_doc="the request's own origin (right only without a proxy)",
    )  # fmt: skip
    # Ledger pool per process: None keeps each service's own maximum (docs/operations/capacity.md).
    db_pool_max_size: int | None = setting(
        "RELAY_DB_POOL_MAX_SIZE", ONE_OR_MORE, None, CAPACITY, LEDGER_SERVICES,
        "Ledger connections per process at most (the ingest-api needs 4 or more).",
        default_doc="each service's own: ingest-api 10, offloader 7, dispatcher, aggregator "
        "and notifier 4, scheduler 2",
    )  # fmt: skip
    db_pool_min_size: int = setting(
        "RELAY_DB_POOL_MIN_SIZE",
        Int(low=0, clamp=False, show_value=True, at_most="RELAY_DB_POOL_MAX_SIZE"), 1,
        CAPACITY, LEDGER_SERVICES,
        "Ledger connections each pool keeps open.",
    )  # fmt: skip
    # asyncpg's prepared-statement cache per connection; 0 behind PgBouncer < 1.21 in
    # transaction mode, which cannot keep a prepared statement across transactions.
    db_statement_cache_size: int = setting(
        "RELAY_DB_STATEMENT_CACHE_SIZE", Int(low=0, clamp=False, show_value=True), 100,
        CAPACITY, SERVICES,
        "Prepared statements cached per connection; `0` behind a transaction-mode "
        "PgBouncer older than 1.21.",
    )  # fmt: skip

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read every ``RELAY_*`` variable; raise :class:`ConfigError` on a bad value."""
        return load(cls, env)

    def describe(self) -> dict[str, object]:
        """Settings as a dict for the start-up log line, with credentials masked."""
        return describe(self)


def check_spool_dir(path: str | None) -> None:
    """:class:`ConfigError` unless ``path`` (``RELAY_UPLOAD_SPOOL_DIR``; None: the system
    temporary directory) is an existing directory this process may write in."""
    if path is None:
        return
    if not os.path.isdir(path):
        raise ConfigError(f"RELAY_UPLOAD_SPOOL_DIR {path!r} is not an existing directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"RELAY_UPLOAD_SPOOL_DIR {path!r} is not writable by this process")


def pool_bounds(settings: Settings, service_max: int) -> tuple[int, int]:
    """``(min_size, max_size)`` of a service's ledger pool: ``RELAY_DB_POOL_MAX_SIZE`` or
    the service's own ``service_max``; raise :class:`ConfigError` if the minimum exceeds it."""
    max_size = settings.db_pool_max_size or service_max
    if settings.db_pool_min_size > max_size:
        raise ConfigError(
            f"RELAY_DB_POOL_MIN_SIZE ({settings.db_pool_min_size}) exceeds this service's pool"
            f" maximum ({max_size}); set RELAY_DB_POOL_MAX_SIZE too"
        )
    return settings.db_pool_min_size, max_size
