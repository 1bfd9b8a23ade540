"""The notifier's span of a traced job: the POST of its completion webhook.

A CLIENT span in the job's trace (under the aggregator's span that ended the job when
the ``job.finished`` event carried it, else under the job's stored context: a retry, a
redelivery), with the HTTP conventions' attributes (the receiver's
address, never its path or query, which may hold a token) and the attempt's number. The
POST carries the span's W3C ``traceparent`` header, so a receiver that traces continues
the job's trace. Untraced jobs (or tracing off) POST as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar
from urllib.parse import urlsplit

from opentelemetry.trace import StatusCode

from relay_batches.tracing import (
    SpanKind,
    current_traceparent,
    enabled,
    in_traced_job,
    job_span,
    traceparent_of,
    with_trace,
)


class _Result(Protocol):
    @property
    def status_code(self) -> int | None:
        """The receiver's HTTP status (None: none came)."""

    @property
    def error(self) -> str | None:
        """Why the POST failed before a status, if it did."""


R = TypeVar("R", bound=_Result)


async def traced_post(
    post: Callable[[str, bytes, dict[str, str]], Awaitable[R]],
    url: str,
    body: bytes,
    headers: dict[str, str],
    trace: str | None,
    attempt: int,
    batch_id: str,
) -> R:
    """``post(url, body, headers)``, in a ``webhook POST`` span of the job whose
    ``trace`` it is (just the POST when there is none). Its parent is the context the
    ``job.finished`` being handled carried (the aggregator's ``record`` that ended the
    job), else (a retry, a deferred or taken-over delivery) the job's stored one."""
    if not enabled():
        return await post(url, body, headers)
    parent = current_traceparent() if in_traced_job() else trace
    if parent is None:
        return await post(url, body, headers)
    parts = urlsplit(url)
    with job_span(
        "webhook POST",
        parent,
        kind=SpanKind.CLIENT,
        attributes={
            "http.request.method": "POST",
            "url.scheme": parts.scheme,
            "server.address": parts.hostname or "",
            "server.port": parts.port or (443 if parts.scheme == "https" else 80),
            "relay.attempt": attempt,
            "relay.batch_id": batch_id,
        },
    ) as span:
        if span is None:
            return await post(url, body, headers)
        result = await post(url, body, with_trace(headers, traceparent_of(span)) or headers)
        if result.status_code is not None:
            span.set_attribute("http.response.status_code", result.status_code)
        if result.error is not None or not 200 <= (result.status_code or 0) < 300:
            span.set_attribute("error.type", str(result.status_code or "no_response"))
            span.set_status(StatusCode.ERROR, (result.error or "")[:200])
        return result
