"""The dispatcher's spans of a traced job: its claim, and the release of each slice.

Both are made under the job's stored trace context (``RunningJob.traceparent``), never
under the context of the delivery being handled (a wake-up or a progress event of another
job may have led to them). A slice's release span is the parent the slice carries to its
row-worker (its W3C ``traceparent`` header), so each row's span hangs under the release
of its slice. An untraced job (or tracing off) makes nothing and carries nothing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from relay_batches.ledger.dispatch import RunningJob
from relay_batches.messages import SliceMessage
from relay_batches.tracing import SpanKind, finished_span, job_span, traceparent_of


def claim_span(job: RunningJob, started_ns: int) -> None:
    """Record the claim of ``job`` (from ``started_ns``, the claim's start, until now)."""
    if not job.traceparent:
        return
    finished_span(
        "claim",
        job.traceparent,
        started_ns,
        time.time_ns(),
        attributes={
            "relay.batch_id": job.id,
            "relay.rows": job.total,
            "relay.from_row": job.dispatched_upto,
            "relay.priority": job.priority,
        },
    )


@contextlib.contextmanager
def release_span(job: RunningJob, job_slice: SliceMessage) -> Iterator[str | None]:
    """The release of one slice of ``job``, around its confirmed publish; yields the
    ``traceparent`` the slice carries (None: the job is not traced)."""
    if not job.traceparent:
        yield None
        return
    rows = job_slice.rows
    with job_span(
        "release",
        job.traceparent,
        kind=SpanKind.PRODUCER,
        attributes={
            "relay.batch_id": job.id,
            "relay.rows": len(rows),
            "relay.first_row": rows[0].index if rows else -1,
            "relay.last_row": rows[-1].index if rows else -1,
            "relay.level": job_slice.level,
            "relay.resent": job_slice.resent,
            "messaging.system": "rabbitmq",
            "messaging.operation.type": "send",
            "messaging.destination.name": "rows",  # <namespace>.rows
        },
    ) as span:
        yield None if span is None else traceparent_of(span)
