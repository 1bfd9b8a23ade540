"""The ingest-api's span of a submit: where a job's trace starts.

Every surface's create goes through :func:`.create.create`, which runs under
:func:`submit_span`: a SERVER span under the caller's W3C ``traceparent`` header when it
sends one (its sampled flag then decides), else the root of a new trace that
``OTEL_TRACES_SAMPLER`` samples or not. The jobs stored under a sampled one keep its
context (``batches.traceparent``): that one decision, per job, is what every later span
of the job follows. Tracing off, nothing is made.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from aiohttp import web
from opentelemetry.trace import Span

from relay_batches.model import Job
from relay_batches.tracing import SpanKind, root_span


@contextlib.contextmanager
def submit_span(request: web.Request, workspace_id: str) -> Iterator[Span | None]:
    """The span of one create request (None when tracing is off)."""
    with root_span(
        "submit",
        request.headers,
        kind=SpanKind.SERVER,
        attributes={
            "http.request.method": request.method,
            "url.path": request.path,
            "relay.workspace_id": workspace_id,
        },
    ) as span:
        yield span


def describe_submit(span: Span | None, jobs: Sequence[Job], response: web.StreamResponse) -> None:
    """Name what a submit created on its span: the jobs, their rows, the answer's status."""
    if span is None:
        return
    span.set_attributes(
        {
            "http.response.status_code": response.status,
            "relay.jobs": len(jobs),
            "relay.rows": sum(job.total for job in jobs),
        }
    )
    if jobs:
        span.set_attributes({"relay.batch_id": jobs[0].id, "relay.model": jobs[0].model})
