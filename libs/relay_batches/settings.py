"""Settings: every ``RELAY_*`` environment variable, read once into one frozen object.

Only a service's ``__main__`` calls :meth:`Settings.from_env`; everything else receives
the object (or the values it needs) as arguments.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import timedelta
from urllib.parse import urlsplit

from relay_batches.durations import SPELLING, parse_duration
from relay_batches.netguard import IPNetwork, parse_networks

RETENTION_MAX_DIGITS = 6  # 999999d at most: far beyond any retention, and no overflow


class ConfigError(Exception):
    """A setting has a value the service cannot start with."""


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None


def _positive(env: Mapping[str, str], name: str, default: float) -> float:
    value = _float(env, name, default)
    if not value > 0:
        raise ConfigError(f"{name} must be a number above 0, got {env.get(name)!r}")
    return value


def _finite_positive(env: Mapping[str, str], name: str, default: float) -> float:
    value = _positive(env, name, default)
    if math.isinf(value):
        raise ConfigError(f"{name} must be a finite number above 0, got {env.get(name)!r}")
    return value


def _at_least_one(env: Mapping[str, str], name: str, default: int) -> int:
    value = _int(env, name, default)
    if value < 1:
        raise ConfigError(f"{name} must be 1 or more, got {env.get(name)!r}")
    return value


def _body_limits(env: Mapping[str, str], d: Settings) -> tuple[int, int]:
    """``(max_body_bytes, max_json_body_bytes)``: a JSON body may not be larger than any
    body. Unset, the JSON limit is its default or the body limit, whichever is smaller
    (lowering only ``RELAY_MAX_BODY_BYTES`` lowers both); set above it, it is refused."""
    max_body = _at_least_one(env, "RELAY_MAX_BODY_BYTES", d.max_body_bytes)
    max_json = _at_least_one(env, "RELAY_MAX_JSON_BODY_BYTES", d.max_json_body_bytes)
    if not env.get("RELAY_MAX_JSON_BODY_BYTES"):
        max_json = min(max_json, max_body)
    if max_json > max_body:
        raise ConfigError(
            f"RELAY_MAX_JSON_BODY_BYTES ({max_json}) exceeds RELAY_MAX_BODY_BYTES ({max_body})"
        )
    return max_body, max_json


def check_spool_dir(path: str | None) -> None:
    """:class:`ConfigError` unless ``path`` (``RELAY_UPLOAD_SPOOL_DIR``; None: the system
    temporary directory) is an existing directory this process may write in."""
    if path is None:
        return
    if not os.path.isdir(path):
        raise ConfigError(f"RELAY_UPLOAD_SPOOL_DIR {path!r} is not an existing directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"RELAY_UPLOAD_SPOOL_DIR {path!r} is not writable by this process")


def _str(env: Mapping[str, str], name: str, default: str) -> str:
    raw = env.get(name)
    return default if raw is None or raw == "" else raw


def _choice(env: Mapping[str, str], name: str, default: str, allowed: tuple[str, ...]) -> str:
    value = _str(env, name, default)
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def port_setting(env: Mapping[str, str], name: str, default: int) -> int:
    """A TCP port setting: 0 (any free port) to 65535, or ``default`` when unset."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 5) or int(raw) > 65535:
        raise ConfigError(f"{name} must be a port number 0..65535, got {raw!r}")
    return int(raw)


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


@dataclass(frozen=True)
class Settings:
    """All configuration of a Relay process. Defaults work on a developer machine."""

    database_url: str = "postgresql://postgres@127.0.0.1:5432/relay"
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    namespace: str = "relay"
    routes_file: str = "deploy/routes.local.toml"
    api_host: str = "127.0.0.1"
    api_port: int = 8080
    health_host: str = "127.0.0.1"
    health_port: int = 0
    batch_concurrency: int = 4
    slice_rows: int = 64
    dispatch_window: int = 1024
    dispatch_window_bytes: int = 16 * 1024 * 1024
    dispatch_window_max: int = 65536
    dispatch_window_max_bytes: int = 256 * 1024 * 1024
    max_running_jobs: int = 64
    max_running_jobs_per_workspace: int = 0
    lease_seconds: float = 30.0
    reconcile_seconds: float = 2.0
    results_flush_ms: float = 25.0
    results_flush_rows: int = 64
    results_message_bytes: int = 256 * 1024
    results_dead_max_length: int = 10_000
    # The type of the durable queues that may be quorum queues (results, notify; see
    # Names.quorum_capable): "classic" or "quorum". dispatch and rows stay classic.
    queue_type: str = "classic"
    results_shards: int = 4
    aggregator_shards: tuple[int, ...] = ()  # the shards this aggregator consumes; (): all
    aggregator_chunk: int = 64
    aggregator_chunk_max: int = 256
    aggregator_prefetch: int = 256
    aggregator_chunk_bytes: int = 16 * 1024 * 1024
    aggregator_linger_ms: float = 20.0
    webhook_timeout_s: float = 10.0
    webhook_allow_networks: tuple[IPNetwork, ...] = ()
    webhook_retry_base_s: float = 30.0  # an automatic webhook retry's first backoff
    retry_base_ms: float = 200.0
    retry_cap_s: float = 10.0
    cooldown_failures: int = 5
    cooldown_window_s: float = 10.0
    cooldown_s: float = 30.0
    max_body_bytes: int = 256 * 1024 * 1024
    # A JSON body is decoded whole in memory; an upload is spooled to disk.
    max_json_body_bytes: int = 100 * 1024 * 1024
    max_rows: int = 1_000_000
    max_content_bytes: int = 1024 * 1024
    max_row_bytes: int = 8 * 1024 * 1024  # one row's text: a line of an uploaded file
    results_page_bytes: int = 4 * 1024 * 1024
    body_read_timeout_s: float = 30.0
    body_min_rate: float = 64 * 1024  # bytes/s a body must average after the read timeout
    large_body_bytes: int = 1024 * 1024
    max_large_bodies: int = 2
    upload_spool_dir: str | None = None  # uploaded files are spooled here (None: TMPDIR)
    shutdown_grace_s: float = 20.0
    log_level: str = "INFO"
    event_loop: str = "uvloop"
    stall_seconds: float = 120.0
    heartbeat_seconds: float = 2.0
    scheduler_max_sleep_s: float = 60.0
    expiry_interval_s: float = 1.0
    # How long an ended job is kept before the scheduler's retention reaper purges it
    # (a workspace may override it: workspaces.retention); and how often that reaper runs.
    retention: timedelta = timedelta(days=30)
    retention_interval_s: float = 60.0
    # Offload: a job runs on its alias's batch deployment only if it may wait the
    # provider's window plus this margin; how often the offloader's loops run.
    offload_margin: timedelta = timedelta(hours=1)
    offload_interval_s: float = 1.0
    # The API's public address (scheme://host[:port][/prefix]) for URLs it hands out
    # (an Anthropic batch's results_url); empty: the request's own origin (dev only:
    # behind a TLS-terminating proxy that origin is http://).
    public_base_url: str = ""
    # Ledger pool per process: None keeps each service's own maximum (ingest-api 10,
    # dispatcher, aggregator and notifier 4, scheduler 2); see docs/capacity.md.
    db_pool_max_size: int | None = None
    db_pool_min_size: int = 1
    # asyncpg's prepared-statement cache per connection; 0 behind PgBouncer < 1.21 in
    # transaction mode, which cannot keep a prepared statement across transactions.
    db_statement_cache_size: int = 100

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read every ``RELAY_*`` variable; raise :class:`ConfigError` on a bad value."""
        env = os.environ if env is None else env
        d = cls()
        pool_max, pool_min, statement_cache = _db_pool(env, d)
        body_limits = _body_limits(env, d)
        return cls(
            database_url=_str(env, "RELAY_DATABASE_URL", d.database_url),
            amqp_url=_str(env, "RELAY_AMQP_URL", d.amqp_url),
            namespace=_namespace(_str(env, "RELAY_NAMESPACE", d.namespace)),
            routes_file=_str(env, "RELAY_ROUTES_FILE", d.routes_file),
            api_host=_str(env, "RELAY_API_HOST", d.api_host),
            api_port=port_setting(env, "RELAY_API_PORT", d.api_port),
            health_host=_str(env, "RELAY_HEALTH_HOST", d.health_host),
            health_port=port_setting(env, "RELAY_HEALTH_PORT", d.health_port),
            batch_concurrency=_clamp(
                _int(env, "RELAY_BATCH_CONCURRENCY", d.batch_concurrency), 1, 32
            ),
            slice_rows=_clamp(_int(env, "RELAY_SLICE_ROWS", d.slice_rows), 1, 1000),
            dispatch_window=max(1, _int(env, "RELAY_DISPATCH_WINDOW", d.dispatch_window)),
            dispatch_window_bytes=max(
                1, _int(env, "RELAY_DISPATCH_WINDOW_BYTES", d.dispatch_window_bytes)
            ),
            dispatch_window_max=max(
                1, _int(env, "RELAY_DISPATCH_WINDOW_MAX", d.dispatch_window_max)
            ),
            dispatch_window_max_bytes=max(
                1, _int(env, "RELAY_DISPATCH_WINDOW_MAX_BYTES", d.dispatch_window_max_bytes)
            ),
            max_running_jobs=max(1, _int(env, "RELAY_MAX_RUNNING_JOBS", d.max_running_jobs)),
            max_running_jobs_per_workspace=max(
                0,
                _int(env, "RELAY_MAX_RUNNING_JOBS_PER_WORKSPACE", d.max_running_jobs_per_workspace),
            ),
            lease_seconds=_positive(env, "RELAY_LEASE_SECONDS", d.lease_seconds),
            reconcile_seconds=_positive(env, "RELAY_RECONCILE_SECONDS", d.reconcile_seconds),
            results_flush_ms=_positive(env, "RELAY_RESULTS_FLUSH_MS", d.results_flush_ms),
            results_flush_rows=max(1, _int(env, "RELAY_RESULTS_FLUSH_ROWS", d.results_flush_rows)),
            results_message_bytes=max(
                1024, _int(env, "RELAY_RESULTS_MESSAGE_BYTES", d.results_message_bytes)
            ),
            results_dead_max_length=max(
                1, _int(env, "RELAY_RESULTS_DEAD_MAX_LENGTH", d.results_dead_max_length)
            ),
            queue_type=_choice(env, "RELAY_QUEUE_TYPE", d.queue_type, ("classic", "quorum")),
            results_shards=_clamp(_int(env, "RELAY_RESULTS_SHARDS", d.results_shards), 1, 64),
            aggregator_shards=_shards(env, "RELAY_AGGREGATOR_SHARDS", "RELAY_RESULTS_SHARDS"),
            aggregator_chunk=max(1, _int(env, "RELAY_AGGREGATOR_CHUNK", d.aggregator_chunk)),
            aggregator_chunk_max=max(
                1, _int(env, "RELAY_AGGREGATOR_CHUNK_MAX", d.aggregator_chunk_max)
            ),
            aggregator_prefetch=max(
                1, _int(env, "RELAY_AGGREGATOR_PREFETCH", d.aggregator_prefetch)
            ),
            aggregator_chunk_bytes=max(
                1, _int(env, "RELAY_AGGREGATOR_CHUNK_BYTES", d.aggregator_chunk_bytes)
            ),
            aggregator_linger_ms=_float(env, "RELAY_AGGREGATOR_LINGER_MS", d.aggregator_linger_ms),
            webhook_timeout_s=_positive(env, "RELAY_WEBHOOK_TIMEOUT_S", d.webhook_timeout_s),
            webhook_allow_networks=_networks(env, "RELAY_WEBHOOK_ALLOW_NETWORKS"),
            webhook_retry_base_s=_finite_positive(
                env, "RELAY_WEBHOOK_RETRY_BASE_S", d.webhook_retry_base_s
            ),
            retry_base_ms=_float(env, "RELAY_RETRY_BASE_MS", d.retry_base_ms),
            retry_cap_s=_positive(env, "RELAY_RETRY_CAP_S", d.retry_cap_s),
            cooldown_failures=max(1, _int(env, "RELAY_COOLDOWN_FAILURES", d.cooldown_failures)),
            cooldown_window_s=_positive(env, "RELAY_COOLDOWN_WINDOW_S", d.cooldown_window_s),
            cooldown_s=_positive(env, "RELAY_COOLDOWN_S", d.cooldown_s),
            max_body_bytes=body_limits[0],
            max_json_body_bytes=body_limits[1],
            max_rows=_at_least_one(env, "RELAY_MAX_ROWS", d.max_rows),
            max_row_bytes=_at_least_one(env, "RELAY_MAX_ROW_BYTES", d.max_row_bytes),
            max_content_bytes=_int(env, "RELAY_MAX_CONTENT_BYTES", d.max_content_bytes),
            results_page_bytes=max(1, _int(env, "RELAY_RESULTS_PAGE_BYTES", d.results_page_bytes)),
            body_read_timeout_s=_positive(env, "RELAY_BODY_READ_TIMEOUT_S", d.body_read_timeout_s),
            body_min_rate=_positive(env, "RELAY_BODY_MIN_RATE", d.body_min_rate),
            large_body_bytes=max(1, _int(env, "RELAY_LARGE_BODY_BYTES", d.large_body_bytes)),
            max_large_bodies=max(1, _int(env, "RELAY_MAX_LARGE_BODIES", d.max_large_bodies)),
            upload_spool_dir=env.get("RELAY_UPLOAD_SPOOL_DIR") or None,
            shutdown_grace_s=_positive(env, "RELAY_SHUTDOWN_GRACE_S", d.shutdown_grace_s),
            log_level=_str(env, "RELAY_LOG_LEVEL", d.log_level).upper(),
            event_loop=_choice(env, "RELAY_EVENT_LOOP", d.event_loop, ("uvloop", "asyncio")),
            stall_seconds=_positive(env, "RELAY_STALL_SECONDS", d.stall_seconds),
            heartbeat_seconds=_positive(env, "RELAY_HEARTBEAT_SECONDS", d.heartbeat_seconds),
            scheduler_max_sleep_s=_positive(
                env, "RELAY_SCHEDULER_MAX_SLEEP_S", d.scheduler_max_sleep_s
            ),
            expiry_interval_s=_finite_positive(env, "RELAY_EXPIRY_INTERVAL_S", d.expiry_interval_s),
            retention=_duration(env, "RELAY_RETENTION", d.retention),
            retention_interval_s=_finite_positive(
                env, "RELAY_RETENTION_INTERVAL_S", d.retention_interval_s
            ),
            offload_margin=_duration(env, "RELAY_OFFLOAD_MARGIN", d.offload_margin),
            offload_interval_s=_finite_positive(
                env, "RELAY_OFFLOAD_INTERVAL_S", d.offload_interval_s
            ),
            public_base_url=_base_url(env, "RELAY_PUBLIC_BASE_URL"),
            db_pool_max_size=pool_max,
            db_pool_min_size=pool_min,
            db_statement_cache_size=statement_cache,
        )

    def describe(self) -> dict[str, object]:
        """Settings as a dict for the start-up log line, with credentials masked."""
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in {"database_url", "amqp_url"}:
                value = _mask_url(str(value))
            if isinstance(value, timedelta):
                value = value.total_seconds()
            if f.name == "webhook_allow_networks":
                value = [str(n) for n in value]
            out[f.name] = value
        return out


def _db_pool(env: Mapping[str, str], d: Settings) -> tuple[int | None, int, int]:
    """``(max_size, min_size, statement_cache_size)`` of the ledger pool, checked."""
    raw_max = env.get("RELAY_DB_POOL_MAX_SIZE", "")
    max_size = None if raw_max == "" else _int(env, "RELAY_DB_POOL_MAX_SIZE", 0)
    if max_size is not None and max_size < 1:
        raise ConfigError(f"RELAY_DB_POOL_MAX_SIZE must be 1 or more, got {raw_max!r}")
    min_size = _int(env, "RELAY_DB_POOL_MIN_SIZE", d.db_pool_min_size)
    if min_size < 0:
        raise ConfigError(f"RELAY_DB_POOL_MIN_SIZE must be 0 or more, got {min_size}")
    if max_size is not None and min_size > max_size:
        raise ConfigError(
            f"RELAY_DB_POOL_MIN_SIZE ({min_size}) exceeds RELAY_DB_POOL_MAX_SIZE ({max_size})"
        )
    cache = _int(env, "RELAY_DB_STATEMENT_CACHE_SIZE", d.db_statement_cache_size)
    if cache < 0:
        raise ConfigError(f"RELAY_DB_STATEMENT_CACHE_SIZE must be 0 or more, got {cache}")
    return max_size, min_size, cache


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


def _duration(env: Mapping[str, str], name: str, default: timedelta) -> timedelta:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    value = parse_duration(raw, RETENTION_MAX_DIGITS)
    if value is None or value <= timedelta(0):
        raise ConfigError(f"{name} must be a duration above 0 ({SPELLING}), got {raw!r}")
    return value


def _networks(env: Mapping[str, str], name: str) -> tuple[IPNetwork, ...]:
    try:
        return parse_networks(env.get(name, ""))
    except ValueError as exc:
        raise ConfigError(f"{name} must be comma-separated CIDRs: {exc}") from None


def _shards(env: Mapping[str, str], name: str, count_name: str) -> tuple[int, ...]:
    """A comma-separated list of results shards, each ``0..RELAY_RESULTS_SHARDS-1``
    (sorted, without repeats); empty when unset: every shard."""
    raw = env.get(name, "").strip()
    if not raw:
        return ()
    count = _clamp(_int(env, count_name, Settings.results_shards), 1, 64)
    parts = [part.strip() for part in raw.split(",")]
    if not all(p.isascii() and p.isdigit() and int(p) < count for p in parts):
        raise ConfigError(
            f"{name} must be comma-separated shard numbers 0..{count - 1}"
            f" ({count_name} is {count}), got {raw!r}"
        )
    return tuple(sorted({int(p) for p in parts}))


def _base_url(env: Mapping[str, str], name: str) -> str:
    """An absolute http(s) URL without query or fragment, its trailing ``/`` removed;
    empty if unset."""
    raw = env.get(name, "").strip()
    if not raw:
        return ""
    parts = urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ConfigError(
            f"{name} must be an http(s) URL like https://relay.example.com, got {raw!r}"
        )
    try:
        _ = parts.port  # a port out of range raises here
    except ValueError:
        raise ConfigError(f"{name} has an invalid port, got {raw!r}") from None
    return raw.rstrip("/")


def _namespace(value: str) -> str:
    if not value.replace("_", "").replace("-", "").isalnum():
        raise ConfigError(f"RELAY_NAMESPACE may hold letters, digits, '-' and '_', got {value!r}")
    return value


def _mask_url(url: str) -> str:
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"


@dataclass(frozen=True)
class ClientSettings:
    """The ``relay batch`` command line's settings: which API, which key, how long to wait.

    Flags given on the command line override these.
    """

    url: str = "http://127.0.0.1:8080"
    api_key: str | None = None
    timeout_s: float = 60.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ClientSettings:
        """Read ``RELAY_URL``, ``RELAY_API_KEY`` and ``RELAY_CLI_TIMEOUT_S``."""
        env = os.environ if env is None else env
        d = cls()
        timeout_s = _float(env, "RELAY_CLI_TIMEOUT_S", d.timeout_s)
        if timeout_s <= 0:
            raise ConfigError(f"RELAY_CLI_TIMEOUT_S must be positive, got {timeout_s}")
        return cls(
            url=_str(env, "RELAY_URL", d.url),
            api_key=env.get("RELAY_API_KEY") or None,
            timeout_s=timeout_s,
        )
