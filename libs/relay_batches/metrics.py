"""Prometheus metrics: every series declared once, with the services that move it.

Each service process serves only its own series on ``/metrics`` (:func:`service_registry`),
never the others' zeros: a metric names the services that move it (``by=``), and is
registered in no global registry. The process, platform and garbage-collector series of
prometheus-client come with every service; the ``_created`` series do not (nothing moves
them). The per-service table of the operations docs lists the same ownership.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from typing import TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

disable_created_metrics()  # type: ignore[no-untyped-call]

INGEST_API = "ingest-api"
SCHEDULER = "scheduler"
DISPATCHER = "dispatcher"
ROW_WORKER = "row-worker"
AGGREGATOR = "aggregator"
NOTIFIER = "notifier"
OFFLOADER = "offloader"
EVERY_SERVICE = (INGEST_API, SCHEDULER, DISPATCHER, ROW_WORKER, AGGREGATOR, NOTIFIER, OFFLOADER)
# The services with a consumer or subscription on the bus (the offloader has none).
CONSUMERS = (INGEST_API, SCHEDULER, DISPATCHER, ROW_WORKER, AGGREGATOR, NOTIFIER)

_OWNED: dict[str, list[Collector]] = defaultdict(list)
M = TypeVar("M", bound=MetricWrapperBase)


def _owned(metric: M, by: Sequence[str]) -> M:
    for service in by:
        if service not in EVERY_SERVICE:
            raise ValueError(f"unknown service {service!r}")
        _OWNED[service].append(metric)
    return metric


def moved_by(collector: Collector) -> tuple[str, ...]:
    """The services that move ``collector``'s series (and serve them)."""
    return tuple(s for s in EVERY_SERVICE if collector in _OWNED.get(s, ()))


def counter(
    name: str, documentation: str, labels: Sequence[str] = (), *, by: Sequence[str]
) -> Counter:
    """A counter moved by the services ``by``."""
    return _owned(Counter(name, documentation, labels, registry=None), by)


def gauge(name: str, documentation: str, labels: Sequence[str] = (), *, by: Sequence[str]) -> Gauge:
    """A gauge moved by the services ``by``."""
    return _owned(Gauge(name, documentation, labels, registry=None), by)


def histogram(
    name: str,
    documentation: str,
    labels: Sequence[str] = (),
    *,
    by: Sequence[str],
    buckets: Sequence[float] = Histogram.DEFAULT_BUCKETS,
) -> Histogram:
    """A histogram moved by the services ``by`` (prometheus-client's default buckets
    unless ``buckets``)."""
    return _owned(Histogram(name, documentation, labels, buckets=buckets, registry=None), by)


ROWS_PROCESSED = counter(
    "relay_rows_processed_total",
    "Row outcomes produced by this row-worker",
    ["outcome"],
    by=(ROW_WORKER,),
)
ROWS_RECORDED = counter(
    "relay_rows_recorded_total",
    "Row outcomes newly recorded in the ledger",
    ["outcome"],
    by=(AGGREGATOR,),
)
ROWS_DROPPED = counter(
    "relay_rows_dropped_total", "Rows dropped because their job was canceled", by=(ROW_WORKER,)
)
ROWS_ALREADY_ANSWERED = counter(
    "relay_rows_already_answered_total",
    "Rows of redelivered or re-sent slices not run again: this worker or the ledger had "
    "their outcome",
    ["source"],
    by=(ROW_WORKER,),
)
ROWS_OVERTAKEN = counter(
    "relay_rows_overtaken_total",
    "Rows a row-worker held, not started, handed back to the broker for higher rows queued",
    by=(ROW_WORKER,),
)
DELIVERIES_LOST = counter(
    "relay_deliveries_lost_total",
    "Slices whose channel closed before every row started (the rest left to the broker)",
    by=(ROW_WORKER,),
)
OUTCOME_UNCONFIRMED = histogram(
    "relay_outcome_unconfirmed_seconds",
    "From a row's answer to the broker's confirm of its outcome, the oldest of each results "
    "message: a crash in between costs the row a second call",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60),
    by=(ROW_WORKER,),
)
ROWS_IN_FLIGHT = gauge(
    "relay_rows_in_flight", "Rows this row-worker is calling a model for", by=(ROW_WORKER,)
)
UPSTREAM_LATENCY = histogram(
    "relay_upstream_latency_seconds",
    "Latency of one upstream call",
    ["deployment"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    by=(ROW_WORKER,),
)
UPSTREAM_CALLS = counter(
    "relay_upstream_calls_total",
    "Upstream calls by deployment and outcome (ok: an answer; error: any failure, retried or not)",
    ["deployment", "outcome"],
    by=(ROW_WORKER,),
)
UPSTREAM_FLEX_REFUSED = counter(
    "relay_upstream_flex_refused_total",
    "Rows a flex deployment refused (429: capacity short), sent on to the next lane",
    ["deployment"],
    by=(ROW_WORKER,),
)
UPSTREAM_RETRIES = counter(
    "relay_upstream_retries_total", "Upstream retries", ["deployment"], by=(ROW_WORKER,)
)
UPSTREAM_FALLBACKS = counter(
    "relay_upstream_fallbacks_total",
    "Rows that fell through to a later deployment",
    ["alias"],
    by=(ROW_WORKER,),
)
UPSTREAM_COOLDOWNS = counter(
    "relay_upstream_cooldowns_total",
    "Cooldowns started for a failing deployment",
    ["deployment"],
    by=(ROW_WORKER,),
)
UPSTREAM_COOLDOWN_ACTIVE = gauge(
    "relay_upstream_cooldown_active",
    "1 while a deployment is cooling down",
    ["deployment"],
    by=(ROW_WORKER,),
)
UPSTREAM_THROTTLED = counter(
    "relay_upstream_throttled_total",
    "Upstream answers 429, or a retryable status with Retry-After",
    ["deployment"],
    by=(ROW_WORKER,),
)
RATELIMIT_GRANTED_REQUESTS = counter(
    "relay_ratelimit_granted_requests_total",
    "Requests the rate-limit leader issued in grants",
    ["deployment"],
    by=(ROW_WORKER,),
)
RATELIMIT_GRANTED_TOKENS = counter(
    "relay_ratelimit_granted_tokens_total",
    "Tokens the rate-limit leader issued in grants",
    ["deployment"],
    by=(ROW_WORKER,),
)
RATELIMIT_USED_REQUESTS = counter(
    "relay_ratelimit_used_requests_total",
    "Requests this worker took from its rate-limit budget",
    ["deployment"],
    by=(ROW_WORKER,),
)
RATELIMIT_USED_TOKENS = counter(
    "relay_ratelimit_used_tokens_total",
    "Tokens the calls of this worker counted against a rate limit (per the reply's usage)",
    ["deployment"],
    by=(ROW_WORKER,),
)
RATELIMIT_WAIT = histogram(
    "relay_ratelimit_wait_seconds",
    "Time a call waited for rate-limit budget",
    ["deployment"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
    by=(ROW_WORKER,),
)
RATELIMIT_RATE_FRACTION = gauge(
    "relay_ratelimit_rate_fraction",
    "The AIMD fraction of the configured limit grants are issued at",
    ["deployment"],
    by=(ROW_WORKER,),
)
RATELIMIT_LEADER = gauge(
    "relay_ratelimit_leader", "1 while this worker issues the grants", by=(ROW_WORKER,)
)
MESSAGES_PUBLISHED = counter(
    "relay_messages_published_total", "Confirmed publishes", ["kind"], by=EVERY_SERVICE
)
MESSAGE_BYTES_PUBLISHED = counter(
    "relay_message_bytes_published_total",
    "Body bytes of confirmed publishes",
    ["kind"],
    by=EVERY_SERVICE,
)
MESSAGES_CONSUMED = counter(
    "relay_messages_consumed_total", "Consumed messages", ["kind"], by=CONSUMERS
)
MESSAGES_DEAD_LETTERED = counter(
    "relay_messages_dead_lettered_total",
    "Messages moved to a dead-letter queue",
    ["queue"],
    by=(AGGREGATOR,),
)
AGGREGATOR_TRANSACTION_ROWS = histogram(
    "relay_aggregator_transaction_rows",
    "Outcomes in one recording transaction of the aggregator",
    buckets=(1, 4, 16, 64, 256, 1024, 4096, 16384, 65536),
    by=(AGGREGATOR,),
)
AGGREGATOR_TRANSACTION_SECONDS = histogram(
    "relay_aggregator_transaction_seconds",
    "Time of one recording transaction of the aggregator",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
    by=(AGGREGATOR,),
)
JOB_TRANSITIONS = counter(
    "relay_job_transitions_total",
    "Job status transitions",
    ["status"],
    by=(INGEST_API, DISPATCHER, SCHEDULER, AGGREGATOR),
)
WEBHOOK_DELIVERIES = counter(
    "relay_webhook_deliveries_total", "Completion webhook deliveries", ["outcome"], by=(NOTIFIER,)
)
HTTP_LATENCY = histogram(
    "relay_http_request_duration_seconds",
    "ingest-api request latency",
    ["method", "route", "status"],
    by=(INGEST_API,),
)

RETENTION_JOBS_PURGED = counter(
    "relay_retention_jobs_purged_total", "Ended jobs purged past their retention", by=(SCHEDULER,)
)
RETENTION_ROWS_PURGED = counter(
    "relay_retention_rows_purged_total",
    "Rows of the jobs purged past their retention",
    by=(SCHEDULER,),
)
RETENTION_OFFLOADS_PURGED = counter(
    "relay_retention_offload_batches_purged_total",
    "Settled provider batch records purged past the retention",
    by=(SCHEDULER,),
)
IDEMPOTENCY_KEYS_PURGED = counter(
    "relay_idempotency_keys_purged_total",
    "Idempotency-Key records purged past their 24 hours",
    by=(SCHEDULER,),
)

OFFLOAD_BATCHES = counter(
    "relay_offload_batches_total",
    "Provider batches the offloader moved into a state (recorded, submitted, ended, settled)",
    ["deployment", "state"],
    by=(OFFLOADER,),
)
OFFLOAD_ROWS = counter(
    "relay_offload_rows_total",
    "Offloaded rows by what became of them (submitted, answered, forwarded, dropped, late:"
    " answered after their job ended, discarded by the ledger)",
    ["outcome"],
    by=(OFFLOADER,),
)
OFFLOAD_POLLS = counter(
    "relay_offload_polls_total", "Polls of provider batches", ["deployment"], by=(OFFLOADER,)
)


JOB_QUEUE_WAIT = histogram(
    "relay_job_queue_wait_seconds",
    "From a job's creation to its first claim by a dispatcher (its rows start going out)",
    buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400),
    by=(DISPATCHER,),
)
JOB_TIME_TO_FINISH = histogram(
    "relay_job_time_to_finish_seconds",
    "From a job's creation to its end, once per job, where its last outcome is recorded",
    ["status"],
    buckets=(1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400, 172800),
    by=(AGGREGATOR,),
)


class BacklogGauges(Collector):
    """The ledger's backlog as the dispatcher holding the backlog lease last read it:
    rows per job status and state (``waiting``: not yet released; ``released``: in the
    broker or held by a row-worker, without an outcome), jobs per status, and the age of
    the oldest queued job. Empty (no series) in every other process, and once the last
    reading is older than its ``fresh_s``, so a sum over the dispatchers counts once."""

    def __init__(self) -> None:
        self._rows: Mapping[tuple[str, str], int] = {}
        self._jobs: Mapping[str, int] = {}
        self._oldest_queued_s = 0.0
        self._until = 0.0

    def show(
        self,
        rows: Mapping[tuple[str, str], int],
        jobs: Mapping[str, int],
        oldest_queued_s: float,
        *,
        until: float,
    ) -> None:
        """Serve this reading until ``until`` (the monotonic clock)."""
        self._rows, self._jobs, self._oldest_queued_s = rows, jobs, oldest_queued_s
        self._until = until

    def hide(self) -> None:
        """Serve nothing (another process holds the lease)."""
        self._until = 0.0

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The gauges' families, without samples (what a registry checks names with)."""
        yield from self._families()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The gauges of the last reading, while it is fresh."""
        if time.monotonic() >= self._until:
            return
        yield from self._families(with_samples=True)

    def _families(self, *, with_samples: bool = False) -> Iterator[GaugeMetricFamily]:
        rows = GaugeMetricFamily(
            "relay_backlog_rows",
            "Rows of unfinished jobs without an outcome, by job status and state (waiting:"
            " not yet released; released: in the broker or held by a row-worker)",
            labels=["status", "state"],
        )
        for (status, state), count in sorted(self._rows.items()) if with_samples else ():
            rows.add_metric([status, state], count)
        jobs = GaugeMetricFamily(
            "relay_backlog_jobs", "Unfinished jobs by status", labels=["status"]
        )
        for status, count in sorted(self._jobs.items()) if with_samples else ():
            jobs.add_metric([status], count)
        yield rows
        yield jobs
        oldest = GaugeMetricFamily(
            "relay_backlog_oldest_queued_seconds", "Age of the oldest queued job (0: none queued)"
        )
        if with_samples:
            oldest.add_metric([], self._oldest_queued_s)
        yield oldest


BACKLOG = BacklogGauges()
_OWNED[DISPATCHER].append(BACKLOG)


def owned_by(service: str) -> tuple[Collector, ...]:
    """The collectors whose series ``service`` moves."""
    return tuple(_OWNED.get(service, ()))


def service_registry(service: str) -> CollectorRegistry:
    """A registry of ``service``'s own series, with the process, platform and garbage
    collector series (an unknown name: those only)."""
    registry = CollectorRegistry()
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR, *owned_by(service)):
        registry.register(collector)
    return registry


def render_metrics(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The metrics of ``registry`` in the Prometheus text format, with its content type."""
    return generate_latest(registry), CONTENT_TYPE_LATEST
