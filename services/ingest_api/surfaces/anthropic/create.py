"""``POST /anthropic/v1/messages/batches`` bodies as jobs: decode, translate, plan.

The body is ``{requests: [{custom_id, params}, …]}`` (:class:`.AnthropicCreateBatch`),
scanned one request at a time (:class:`.scan.JsonScanner`: only the translated rows are
kept, never the decoded body), each request translated into a Relay row by
:func:`.row_formats.anthropic_request_row`. A bad request is a 400 naming its field,
``requests[3].params.messages[0].content``; a custom id used twice names both requests.
The job takes its default model from the first request (every row stores its own) and
expires 24 hours after it was created, as Anthropic's batches do.
"""

from __future__ import annotations

from collections.abc import Container, Iterator
from dataclasses import replace
from datetime import datetime

from relay_batches.dialects.anthropic.render import EXPIRY
from relay_batches.errors import ApiError, invalid
from relay_batches.services.ingest_api.deps import ApiDeps
from relay_batches.services.ingest_api.rows.job_fields import (
    BatchOptions,
)
from relay_batches.services.ingest_api.rows.row_formats import anthropic_request_row
from relay_batches.services.ingest_api.rows.scan import JsonScanner, NotJson
from relay_batches.services.ingest_api.rows.validation import (
    RowInput,
    RowRejected,
    SubmitLimits,
    at_most,
    check_unique_ids,
    row_api_error,
    sized_elements,
)
from relay_batches.services.ingest_api.submit import PlannedJob, plan_job, row_models

BODY_FIELDS = ("requests",)
SURFACE = "anthropic"  # batches.surface: its webhook events name it msgbatch_…


def plan_batch(
    raw: bytes | bytearray, deps: ApiDeps, workspace_id: str, now: datetime
) -> PlannedJob:
    """The job of a create body, or the 400 of its first problem.

    CPU-bound and free of the event loop: callers run it in a worker thread.
    """
    rows = scan_requests(raw, deps.limits, row_models(deps))
    options = BatchOptions(
        name=None,
        model=rows[0].model or "",
        priority=0,
        webhook_url=None,
        cron=None,
        completion_window=EXPIRY,
    )
    planned = plan_job(options, rows, workspace_id, now)
    return replace(planned, new=replace(planned.new, surface=SURFACE))


def scan_requests(
    raw: bytes | bytearray, limits: SubmitLimits, known_models: Container[str]
) -> list[RowInput]:
    """The translated rows of a create body (module docstring)."""
    scanner = JsonScanner(raw)
    try:
        rows = _scan_body(scanner, limits, known_models)
    except NotJson as exc:
        if exc.nested:
            raise invalid("request body must be JSON nested at most 1,000 levels deep") from None
        raise invalid("request body must be JSON") from None
    try:
        check_unique_ids(rows)
    except RowRejected as exc:
        raise row_api_error(exc.error) from None
    return rows


def _scan_body(
    scanner: JsonScanner, limits: SubmitLimits, known_models: Container[str]
) -> list[RowInput]:
    if scanner.peek() != "{":
        scanner.value()  # JSON, but not an object (else NotJson)
        if not scanner.at_end():
            raise NotJson()
        raise invalid("request body must be a JSON object")
    rows: list[RowInput] | None = None
    for key in scanner.members():
        if key not in BODY_FIELDS:
            raise invalid(f"{key!r}: extra inputs are not permitted (fields: requests)", key)
        if scanner.peek() != "[":
            scanner.value()
            raise invalid("requests: must be a non-empty array", "requests")
        elements = sized_elements(scanner, scanner.elements(), limits.max_row_bytes)
        rows = _translated(elements, limits, known_models)
    if not scanner.at_end():
        raise NotJson()
    if rows is None:
        raise invalid("requests: field required", "requests")
    if not rows:
        raise invalid("requests: must be a non-empty array", "requests")
    return rows


def _translated(
    elements: Iterator[object], limits: SubmitLimits, known_models: Container[str]
) -> list[RowInput]:
    """Each request of the array as a row; the first bad one is a 400 naming its field."""
    rows: list[RowInput] = []
    try:
        for i, request in enumerate(at_most(elements, limits.max_rows)):
            try:
                rows.append(anthropic_request_row(i, request, limits, known_models))
            except TypeError:  # a value JSON can hold but the row encoder cannot
                raise invalid(
                    f"requests[{i}].params: holds a value that cannot be stored"
                    " (an integer beyond 64 bits, or text that is not valid Unicode)",
                    f"requests[{i}].params",
                ) from None
    except RowRejected as exc:  # a bad request, or one over RELAY_MAX_ROW_BYTES
        raise _request_error(exc) from None
    return rows


def _request_error(exc: RowRejected) -> ApiError:
    """``requests[3].params.messages[0].content: …`` (Anthropic puts a colon after the
    field), with the same ``param``."""
    error = row_api_error(exc.error)
    param = error.param or "requests"
    return invalid(f"{param}:{error.message.removeprefix(param)}", param)
