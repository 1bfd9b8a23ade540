"""Traces: OpenTelemetry spans of each job across the services, one trace per job.

Off by default, and then nothing of the SDK is even imported: every helper here checks
one flag and returns. :func:`setup_tracing` (called once by
:func:`~relay_batches.runtime.run_service`) turns it on from the standard ``OTEL_*``
variables (:mod:`.setup`). A job is sampled once, when it is submitted (the
``OTEL_TRACES_SAMPLER`` decision); its W3C context is stored with it
(``batches.traceparent``) and travels in the AMQP headers of its messages
(:data:`HEADER`), so every service's spans of the job, one per row included, land in its
trace; an unsampled job carries nothing and no service makes a span of it
(:mod:`.spans`). See docs/operations/tracing.md.
"""

from __future__ import annotations

from relay_batches.tracing.setup import DEFAULT_RATIO, setup_tracing, tracing_wanted
from relay_batches.tracing.spans import (
    HEADER,
    SpanKind,
    attach_delivered,
    child_span,
    current_traceparent,
    detach,
    enabled,
    finished_span,
    in_traced_job,
    job_span,
    root_span,
    traceparent_of,
    with_trace,
)

__all__ = [
    "DEFAULT_RATIO",
    "HEADER",
    "SpanKind",
    "attach_delivered",
    "child_span",
    "current_traceparent",
    "detach",
    "enabled",
    "finished_span",
    "in_traced_job",
    "job_span",
    "root_span",
    "setup_tracing",
    "traceparent_of",
    "tracing_wanted",
    "with_trace",
]
