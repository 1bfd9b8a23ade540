"""Prometheus metrics shared by the services (prometheus-client, default registry)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

ROWS_PROCESSED = Counter(
    "relay_rows_processed_total", "Row outcomes produced by this row-worker", ["outcome"]
)
ROWS_RECORDED = Counter(
    "relay_rows_recorded_total", "Row outcomes newly recorded in the ledger", ["outcome"]
)
ROWS_DROPPED = Counter("relay_rows_dropped_total", "Rows dropped because their job was canceled")
ROWS_ALREADY_ANSWERED = Counter(
    "relay_rows_already_answered_total",
    "Rows of redelivered or re-sent slices not run again: this worker or the ledger had "
    "their outcome",
    ["source"],
)
ROWS_OVERTAKEN = Counter(
    "relay_rows_overtaken_total",
    "Rows a row-worker held, not started, handed back to the broker for higher rows queued",
)
DELIVERIES_LOST = Counter(
    "relay_deliveries_lost_total",
    "Slices whose channel closed before every row started (the rest left to the broker)",
)
OUTCOME_UNCONFIRMED = Histogram(
    "relay_outcome_unconfirmed_seconds",
    "From a row's answer to the broker's confirm of its outcome, the oldest of each results "
    "message: a crash in between costs the row a second call",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60),
)
ROWS_IN_FLIGHT = Gauge("relay_rows_in_flight", "Rows this row-worker is calling a model for")
UPSTREAM_LATENCY = Histogram(
    "relay_upstream_latency_seconds",
    "Latency of one upstream call",
    ["deployment"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
UPSTREAM_RETRIES = Counter("relay_upstream_retries_total", "Upstream retries", ["deployment"])
UPSTREAM_FALLBACKS = Counter(
    "relay_upstream_fallbacks_total", "Rows that fell through to a later deployment", ["alias"]
)
UPSTREAM_FLEX_REFUSED = Counter(
    "relay_upstream_flex_refused_total",
    "Rows a flex deployment refused (429: capacity short), sent on to the next lane",
    ["deployment"],
)
UPSTREAM_COOLDOWNS = Counter(
    "relay_upstream_cooldowns_total", "Cooldowns started for a failing deployment", ["deployment"]
)
UPSTREAM_COOLDOWN_ACTIVE = Gauge(
    "relay_upstream_cooldown_active", "1 while a deployment is cooling down", ["deployment"]
)
UPSTREAM_THROTTLED = Counter(
    "relay_upstream_throttled_total",
    "Upstream answers 429, or a retryable status with Retry-After",
    ["deployment"],
)
RATELIMIT_GRANTED_REQUESTS = Counter(
    "relay_ratelimit_granted_requests_total",
    "Requests the rate-limit leader issued in grants",
    ["deployment"],
)
RATELIMIT_GRANTED_TOKENS = Counter(
    "relay_ratelimit_granted_tokens_total",
    "Tokens the rate-limit leader issued in grants",
    ["deployment"],
)
RATELIMIT_USED_REQUESTS = Counter(
    "relay_ratelimit_used_requests_total",
    "Requests this worker took from its rate-limit budget",
    ["deployment"],
)
RATELIMIT_USED_TOKENS = Counter(
    "relay_ratelimit_used_tokens_total",
    "Tokens the calls of this worker counted against a rate limit (per the reply's usage)",
    ["deployment"],
)
RATELIMIT_WAIT = Histogram(
    "relay_ratelimit_wait_seconds",
    "Time a call waited for rate-limit budget",
    ["deployment"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
RATELIMIT_RATE_FRACTION = Gauge(
    "relay_ratelimit_rate_fraction",
    "The AIMD fraction of the configured limit grants are issued at",
    ["deployment"],
)
RATELIMIT_LEADER = Gauge("relay_ratelimit_leader", "1 while this worker issues the grants")
MESSAGES_PUBLISHED = Counter("relay_messages_published_total", "Confirmed publishes", ["kind"])
MESSAGE_BYTES_PUBLISHED = Counter(
    "relay_message_bytes_published_total", "Body bytes of confirmed publishes", ["kind"]
)
MESSAGES_CONSUMED = Counter("relay_messages_consumed_total", "Consumed messages", ["kind"])
MESSAGES_DEAD_LETTERED = Counter(
    "relay_messages_dead_lettered_total", "Messages moved to a dead-letter queue", ["queue"]
)
AGGREGATOR_TRANSACTION_ROWS = Histogram(
    "relay_aggregator_transaction_rows",
    "Outcomes in one recording transaction of the aggregator",
    buckets=(1, 4, 16, 64, 256, 1024, 4096, 16384, 65536),
)
AGGREGATOR_TRANSACTION_SECONDS = Histogram(
    "relay_aggregator_transaction_seconds",
    "Time of one recording transaction of the aggregator",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
JOB_TRANSITIONS = Counter("relay_job_transitions_total", "Job status transitions", ["status"])
WEBHOOK_DELIVERIES = Counter(
    "relay_webhook_deliveries_total", "Completion webhook deliveries", ["outcome"]
)
HTTP_LATENCY = Histogram(
    "relay_http_request_duration_seconds",
    "ingest-api request latency",
    ["method", "route", "status"],
)

RETENTION_JOBS_PURGED = Counter(
    "relay_retention_jobs_purged_total", "Ended jobs purged past their retention"
)
RETENTION_ROWS_PURGED = Counter(
    "relay_retention_rows_purged_total", "Rows of the jobs purged past their retention"
)
RETENTION_OFFLOADS_PURGED = Counter(
    "relay_retention_offload_batches_purged_total",
    "Settled provider batch records purged past the retention",
)
IDEMPOTENCY_KEYS_PURGED = Counter(
    "relay_idempotency_keys_purged_total", "Idempotency-Key records purged past their 24 hours"
)

OFFLOAD_BATCHES = Counter(
    "relay_offload_batches_total",
    "Provider batches the offloader moved into a state (recorded, submitted, ended, settled)",
    ["deployment", "state"],
)
OFFLOAD_ROWS = Counter(
    "relay_offload_rows_total",
    "Offloaded rows by what became of them (submitted, answered, forwarded, dropped, late:"
    " answered after their job ended, discarded by the ledger)",
    ["outcome"],
)
OFFLOAD_POLLS = Counter("relay_offload_polls_total", "Polls of provider batches", ["deployment"])


def render_metrics() -> tuple[bytes, str]:
    """The current metrics in the Prometheus text format, with its content type."""
    return generate_latest(), CONTENT_TYPE_LATEST
