"""Making spans of a job, and carrying its context: the helpers every service uses.

Each helper first checks whether tracing is on (one attribute read) and, for a job, whether
it is traced (its ``traceparent``, sampled, or none): off, or for an unsampled job, it
returns at once and makes nothing. A span of a job is always started under an explicit
parent (the job's stored context, or the context its delivery carried), never under
whatever happens to be current, so a handler that touches several jobs (the dispatcher's
claim, the aggregator's chunk) cannot put one job's span in another's trace.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import Token
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

__all__ = ["HEADER", "SpanKind"]

HEADER = "traceparent"  # the W3C header, in AMQP message headers and HTTP requests alike
_PROPAGATOR = TraceContextTextMapPropagator()
Attributes = Mapping[str, AttributeValue]


class _State:
    """The tracer while tracing is on (None: off)."""

    tracer: Tracer | None = None


_STATE = _State()


def install(tracer: Tracer | None) -> None:
    """Turn tracing on with ``tracer`` (None: off); :func:`~.setup.setup_tracing`'s."""
    _STATE.tracer = tracer


def enabled() -> bool:
    """Whether tracing is on in this process."""
    return _STATE.tracer is not None


def _context_of(traceparent: str) -> otel_context.Context | None:
    """The context a sampled ``traceparent`` names (None: malformed, or not sampled)."""
    parent = _PROPAGATOR.extract({HEADER: traceparent})
    found = trace.get_current_span(parent).get_span_context()
    return parent if found.is_valid and found.trace_flags.sampled else None


def traceparent_of(span: Span) -> str | None:
    """``span``'s context as a W3C ``traceparent``, if it is sampled (else None)."""
    found = span.get_span_context()
    if not (found.is_valid and found.trace_flags.sampled):
        return None
    return f"00-{found.trace_id:032x}-{found.span_id:016x}-{int(found.trace_flags):02x}"


def current_traceparent() -> str | None:
    """The current span's ``traceparent`` when tracing is on and it is sampled: what a job
    inserted now stores, what a message published now carries."""
    if _STATE.tracer is None:
        return None
    return traceparent_of(trace.get_current_span())


def with_trace(headers: Mapping[str, str] | None, traceparent: str | None) -> dict[str, str] | None:
    """``headers`` with the W3C ``traceparent`` added (unchanged without one)."""
    if not traceparent:
        return None if headers is None else dict(headers)
    return {**(headers or {}), HEADER: traceparent}


def attach_delivered(headers: Mapping[str, Any] | None) -> Token[otel_context.Context] | None:
    """Make the context a delivery's headers carry current (the kit's consumer, around
    its handler); a token for :func:`detach`, or None when there is none to attach."""
    if _STATE.tracer is None or not headers:
        return None
    value = headers.get(HEADER)
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str):
        return None
    parent = _context_of(value)
    return None if parent is None else otel_context.attach(parent)


def detach(token: Token[otel_context.Context] | None) -> None:
    """Undo :func:`attach_delivered`."""
    if token is not None:
        otel_context.detach(token)


@contextlib.contextmanager
def job_span(
    name: str,
    traceparent: str | None,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Attributes | None = None,
) -> Iterator[Span | None]:
    """A span of a job, current while the block runs, whose parent is the job's stored
    ``traceparent``; None (nothing made) when tracing is off or the job is not traced."""
    tracer = _STATE.tracer
    parent = None if tracer is None or not traceparent else _context_of(traceparent)
    if tracer is None or parent is None:
        yield None
        return
    with tracer.start_as_current_span(
        name, context=parent, kind=kind, attributes=attributes
    ) as span:
        yield span


@contextlib.contextmanager
def child_span(
    name: str, *, kind: SpanKind = SpanKind.INTERNAL, attributes: Attributes | None = None
) -> Iterator[Span | None]:
    """A span under the current one, when that is sampled (a delivery of a traced job:
    :func:`attach_delivered`); None, and nothing made, otherwise."""
    tracer = _STATE.tracer
    if tracer is None or not trace.get_current_span().get_span_context().trace_flags.sampled:
        yield None
        return
    with tracer.start_as_current_span(name, kind=kind, attributes=attributes) as span:
        yield span


@contextlib.contextmanager
def root_span(
    name: str,
    headers: Mapping[str, str],
    *,
    kind: SpanKind = SpanKind.SERVER,
    attributes: Attributes | None = None,
) -> Iterator[Span | None]:
    """A span that starts a job's trace (a submit): under the caller's W3C context when its
    ``headers`` carry one (its sampled flag then decides), else a new trace, sampled by
    ``OTEL_TRACES_SAMPLER``; None when tracing is off. Current while the block runs, so
    the jobs inserted under it store its context (:func:`current_traceparent`)."""
    tracer = _STATE.tracer
    if tracer is None:
        yield None
        return
    incoming = headers.get(HEADER)
    parent = _PROPAGATOR.extract({HEADER: incoming}) if incoming else otel_context.Context()
    with tracer.start_as_current_span(
        name, context=parent, kind=kind, attributes=attributes
    ) as span:
        yield span


def finished_span(
    name: str,
    traceparent: str | None,
    start_ns: int,
    end_ns: int,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Attributes | None = None,
) -> str | None:
    """Record a span of a job that already happened (from ``start_ns`` to ``end_ns``, Unix
    nanoseconds), under its stored ``traceparent``: one step that served several jobs at
    once (a claim, a chunk recorded) gets a span in each traced job's trace. Returns the
    span's ``traceparent`` (None: tracing off, or the job not traced)."""
    tracer = _STATE.tracer
    parent = None if tracer is None or not traceparent else _context_of(traceparent)
    if tracer is None or parent is None:
        return None
    span = tracer.start_span(
        name, context=parent, kind=kind, attributes=attributes, start_time=start_ns
    )
    span.end(end_time=end_ns)
    return traceparent_of(span)


def in_traced_job() -> bool:
    """Whether the current context is a traced job's (tracing on, its delivery sampled):
    the one check a row makes before any span work."""
    if _STATE.tracer is None:
        return False
    return bool(trace.get_current_span().get_span_context().trace_flags.sampled)
