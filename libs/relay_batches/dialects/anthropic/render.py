"""A job and its stored outcomes as the Anthropic Message Batches API shows them.

Ids: a job ``h`` is ``msgbatch_h``. Status: queued, scheduled and running are
``in_progress``; every terminal status is ``ended`` (``canceling`` is never shown: a
cancel is synchronous, so a canceled batch is ``ended`` with ``cancel_initiated_at``
set). Counts: rows with content have ``succeeded``, rows with an error ``errored``; the
rows without an outcome are ``processing`` while the batch runs and, once it has ended,
``canceled`` (canceled batch), ``expired`` (expired batch) or ``errored`` (failed batch).
Counts move as rows finish (Anthropic's own show only ``processing`` until the end).
``expires_at`` is the job's deadline; a job without one (created natively, without a
completion window) shows ``created_at`` + 24 h, since the object requires a time.

A result line's ``message`` is built from the outcome: a text block (left out when the
model only called tools), a ``tool_use`` block per well-formed stored chat tool call
(a stored value that is not a list of calls, left by rows recorded before replies were
checked, renders as no calls rather than breaking the stream) with ``input``
its JSON ``arguments`` (arguments that are not a JSON object, which only a misbehaving
model writes, are kept whole as ``{"raw_arguments": text}``), the stop reason mapped back
from the finish reason, the usage, the model that answered, and an id derived from the
job and row, so the same row always renders the same message.
"""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta
from typing import Any

import orjson

from relay_batches.dialects.anthropic.shapes import (
    AnthropicMessageBatch,
    AnthropicRequestCounts,
    ErrorType,
    ProcessingStatus,
    StopReason,
)
from relay_batches.ids import is_valid_id
from relay_batches.ledger.jobs import AnsweredRow
from relay_batches.model import TERMINAL, Job, JobStatus
from relay_batches.tool_calls import stored_tool_calls

ID_PREFIX = "msgbatch_"
BATCHES_PATH = "/anthropic/v1/messages/batches"  # where Relay serves them
EXPIRY = timedelta(hours=24)  # Anthropic batches end 24 hours after they are created

STOP_REASONS: dict[str, StopReason] = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}
# The error type of an upstream failure, by the HTTP status it names.
_UPSTREAM_STATUS = re.compile(r"\bHTTP (\d{3})\b")
_ERROR_TYPES: dict[int, ErrorType] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def public_id(job_id: str) -> str:
    """The Anthropic id of job ``job_id``."""
    return ID_PREFIX + job_id


def job_id_of(batch_id: str) -> str | None:
    """The job id inside an Anthropic id, or None when it is not one."""
    if not batch_id.startswith(ID_PREFIX):
        return None
    job_id = batch_id[len(ID_PREFIX) :]
    return job_id if is_valid_id(job_id) else None


def processing_status(job: Job) -> ProcessingStatus:
    """``ended`` once the job is terminal, ``in_progress`` before."""
    return "ended" if job.status in TERMINAL else "in_progress"


def request_counts(job: Job) -> AnthropicRequestCounts:
    """The job's rows by state (module docstring); they add up to its total."""
    left = job.total - job.completed - job.failed
    ended = job.status in TERMINAL
    return AnthropicRequestCounts(
        processing=0 if ended else left,
        succeeded=job.completed,
        errored=job.failed + (left if job.status == JobStatus.FAILED else 0),
        canceled=left if job.status == JobStatus.CANCELED else 0,
        expired=left if job.status == JobStatus.EXPIRED else 0,
    )


def batch_model(job: Job, origin: str) -> AnthropicMessageBatch:
    """The Message Batch of ``job``; ``origin`` (``scheme://host[/prefix]``, no trailing
    slash: the public base URL or the request's origin) roots ``results_url``."""
    ended = job.status in TERMINAL
    ended_at = (job.completed_at or job.created_at) if ended else None
    batch_id = public_id(job.id)
    return AnthropicMessageBatch(
        id=batch_id,
        processing_status=processing_status(job),
        request_counts=request_counts(job),
        created_at=job.created_at,
        expires_at=job.expires_at or job.created_at + EXPIRY,
        ended_at=ended_at,
        cancel_initiated_at=ended_at if job.status == JobStatus.CANCELED else None,
        results_url=f"{origin}{BATCHES_PATH}/{batch_id}/results" if ended else None,
    )


def batch_object(job: Job, origin: str) -> dict[str, Any]:
    """:func:`batch_model` as JSON-ready data."""
    return batch_model(job, origin).model_dump(mode="json")


# --- results -------------------------------------------------------------------------


def result_line(job: Job, row: AnsweredRow) -> dict[str, Any]:
    """One results line of an ended job: ``{custom_id, result}``."""
    if row.content is not None:
        result: dict[str, Any] = {"type": "succeeded", "message": message_of(job, row)}
    elif row.error is not None:
        result = {"type": "errored", "error": error_object(row.error)}
    elif job.status == JobStatus.EXPIRED:
        result = {"type": "expired"}
    elif job.status == JobStatus.FAILED:
        result = {"type": "errored", "error": error_object(job.error or "the batch failed")}
    else:
        result = {"type": "canceled"}
    return {"custom_id": row.custom_id, "result": result}


def error_object(message: str) -> dict[str, Any]:
    """Anthropic's error object for a row's stored error."""
    found = _UPSTREAM_STATUS.search(message)
    kind: ErrorType = _ERROR_TYPES.get(int(found.group(1)), "api_error") if found else "api_error"
    return {"type": "error", "error": {"type": kind, "message": message}}


def message_of(job: Job, row: AnsweredRow) -> dict[str, Any]:
    """The Messages API message of an answered row (module docstring)."""
    calls = _tool_use_blocks(row.tool_calls)
    content: list[dict[str, Any]] = (
        [] if calls and not row.content else [{"type": "text", "text": row.content or ""}]
    )
    content.extend(calls)
    return {
        "id": message_id(job.id, row.row_index),
        "type": "message",
        "role": "assistant",
        "model": row.model or job.model,
        "content": content,
        "stop_reason": _stop_reason(row.finish_reason, bool(calls)),
        "stop_sequence": None,
        "usage": {
            "input_tokens": row.prompt_tokens or 0,
            "output_tokens": row.completion_tokens or 0,
        },
    }


def message_id(job_id: str, row_index: int) -> str:
    """``msg_`` and 24 hex digits, the same for the same row every time."""
    digest = hashlib.blake2b(f"{job_id}:{row_index}".encode(), digest_size=12).hexdigest()
    return f"msg_{digest}"


def _stop_reason(finish_reason: str | None, called_tools: bool) -> StopReason:
    if finish_reason is not None and finish_reason in STOP_REASONS:
        return STOP_REASONS[finish_reason]
    return "tool_use" if called_tools else "end_turn"


def _tool_use_blocks(tool_calls: str | None) -> list[dict[str, Any]]:
    """The stored chat ``tool_calls`` JSON as ``tool_use`` blocks (only its well-formed
    calls: :func:`~relay_batches.tool_calls.stored_tool_calls`)."""
    return [
        {
            "type": "tool_use",
            "id": call["id"],
            "name": call["function"]["name"],
            "input": _arguments(call["function"]["arguments"]),
        }
        for call in stored_tool_calls(tool_calls)
    ]


def _arguments(arguments: str) -> dict[str, Any]:
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {"raw_arguments": arguments}
    return parsed if isinstance(parsed, dict) else {"raw_arguments": arguments}
