"""The aggregator's span of a traced job: the recording of its outcomes in one chunk.

One chunk's transaction records the outcomes of several jobs at once; each traced job
among them (its ``traceparent`` comes back with its counters, from the same UPDATE) gets
a ``record`` span of that transaction in its own trace, saying how many of its rows it
recorded and whether it ended the job. Untraced jobs (or tracing off) get nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from relay_batches.ledger.outcomes import JobProgress
from relay_batches.tracing import SpanKind, enabled, finished_span


def record_spans(progress: Sequence[JobProgress], started_ns: int, ended_ns: int) -> dict[str, str]:
    """A ``record`` span from ``started_ns`` to ``ended_ns`` for each traced job of a
    chunk; each span's ``traceparent`` by job id (what the job's events then carry)."""
    traces: dict[str, str] = {}
    if not enabled():
        return traces
    for job in progress:
        if job.traceparent:
            recorded = finished_span(
                "record",
                job.traceparent,
                started_ns,
                ended_ns,
                kind=SpanKind.CONSUMER,
                attributes={
                    "relay.batch_id": job.id,
                    "relay.rows": job.new_completed + job.new_failed,
                    "relay.rows_failed": job.new_failed,
                    "relay.completed": job.completed,
                    "relay.failed": job.failed,
                    "relay.status": str(job.status),
                    "relay.finished": job.terminal,
                    "messaging.system": "rabbitmq",
                    "messaging.operation.type": "process",
                },
            )
            if recorded is not None:
                traces[job.id] = recorded
    return traces
