"""A batch's rows as the lines of OpenAI's output and error files (pure rendering).

Each line is ``{id, custom_id, response, error}`` (a job of another endpoint than chat:
its output lines' ``body`` is the provider's body as it came). The output file holds the rows that
succeeded, each ``response: {status_code: 200, request_id, body}`` with ``body`` a
``chat.completion`` built from the stored outcome (message content and tool calls,
finish reason, usage, the model that answered; only the well-formed stored tool calls and
a finish reason of the chat vocabulary are shown, so a stored value left by rows
recorded before replies were checked cannot make a line the SDK rejects; a refusal is
stored as content with finish reason ``content_filter`` and shows as such); an answer
whose outcome kept the provider's whole reply (``n`` above 1, ``logprobs``, audio, see
:mod:`.upstream`) has that reply as its body, every choice included. The error
file holds every other row,
``response: null`` and ``error: {code, message}``: a row that failed with Relay's error
code (``upstream_error``, ``internal_error``) and message, a row a cancel kept from
running ``batch_cancelled``, one past the completion window ``batch_expired``.
"""

from __future__ import annotations

import re

import orjson

from relay_batches.dialects.endpoints import CHAT
from relay_batches.ledger.jobs import AnsweredRow
from relay_batches.model import Job, JobStatus
from relay_batches.tool_calls import stored_finish_reason, stored_tool_calls

BATCH_PREFIX = "batch_"  # a job ``h`` is ``batch_h`` on the OpenAI surface
OUTPUT = "output"
ERROR = "error"
_NOT_RUN: dict[JobStatus, tuple[str, str]] = {
    JobStatus.CANCELED: (
        "batch_cancelled",
        "This request was not executed because the batch was cancelled.",
    ),
    JobStatus.EXPIRED: (
        "batch_expired",
        "This request could not be executed before the completion window expired.",
    ),
}
_HTTP_STATUS = re.compile(r"\bHTTP (\d{3})\b")
_FAILED_UNRUN = ("batch_failed", "This request was not executed because the batch failed.")


def _line_id(prefix: str, job: Job, row: AnsweredRow) -> str:
    return f"{prefix}{job.id}{row.row_index:08x}"


def success_line(job: Job, row: AnsweredRow, created: int) -> dict[str, object]:
    """A succeeded row's line: a 200 whose body is a ``chat.completion``: the provider's
    own when the outcome kept it whole (several choices, log probabilities, …)."""
    if row.body is not None:
        return _line(job, row, orjson.Fragment(row.body))
    tool_calls = stored_tool_calls(row.tool_calls) or None
    content = None if tool_calls is not None and not row.content else (row.content or "")
    finish_reason = stored_finish_reason(row.finish_reason)
    prompt, completion = row.prompt_tokens or 0, row.completion_tokens or 0
    body = {
        "id": _line_id("chatcmpl-", job, row),
        "object": "chat.completion",
        "created": created,
        "model": row.model or job.model,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": content,
                    "refusal": None,
                    "tool_calls": tool_calls,
                },
                "logprobs": None,
                "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
        "system_fingerprint": None,
    }
    return _line(job, row, body)


def body_line(job: Job, row: AnsweredRow) -> dict[str, object]:
    """A succeeded row's line of a job of another endpoint than chat: a 200 whose body
    is the provider's JSON body as it came (stored only once it parsed as an object)."""
    return _line(job, row, orjson.Fragment(row.content or "{}"))


def _line(job: Job, row: AnsweredRow, body: object) -> dict[str, object]:
    return {
        "id": _line_id("batch_req_", job, row),
        "custom_id": row.custom_id,
        "response": {
            "status_code": 200,
            "request_id": _line_id("req_", job, row),
            "body": body,
        },
        "error": None,
    }


def upstream_status(error: str) -> int:
    """The HTTP status a failed row's stored error names (``… HTTP 429 …``), 500 when
    it names none in 400–599."""
    found = _HTTP_STATUS.search(error)
    status = int(found.group(1)) if found else 500
    return status if 400 <= status <= 599 else 500


def error_line(job: Job, row: AnsweredRow) -> dict[str, object]:
    """A row without a success: a row that ran and failed has the failed ``response``
    (its status and an error body); a row that never ran has ``error`` saying why."""
    if row.error is None:
        code, message = _NOT_RUN.get(job.status, _FAILED_UNRUN)
        return {
            "id": _line_id("batch_req_", job, row),
            "custom_id": row.custom_id,
            "response": None,
            "error": {"code": code, "message": message},
        }
    status = upstream_status(row.error)
    code, _, _ = row.error.partition(":")
    body = {
        "error": {
            "message": row.error,
            "type": "invalid_request_error" if status < 500 else "server_error",
            "param": None,
            "code": code if code.isidentifier() else "request_failed",
        }
    }
    return {
        "id": _line_id("batch_req_", job, row),
        "custom_id": row.custom_id,
        "response": {
            "status_code": status,
            "request_id": _line_id("req_", job, row),
            "body": body,
        },
        "error": None,
    }


def render_page(job: Job, kind: str, rows: list[AnsweredRow]) -> bytes:
    """One page of the file as JSONL bytes."""
    dumps = orjson.dumps
    if kind == OUTPUT and job.endpoint != CHAT:
        return b"".join(dumps(body_line(job, r)) + b"\n" for r in rows)
    if kind == OUTPUT:
        created = int((job.completed_at or job.created_at).timestamp())
        return b"".join(dumps(success_line(job, r, created)) + b"\n" for r in rows)
    return b"".join(dumps(error_line(job, r)) + b"\n" for r in rows)
