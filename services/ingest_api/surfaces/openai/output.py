"""A batch's output and error files in OpenAI's line format, rendered from the ledger.

Each line is ``{id, custom_id, response, error}``. The output file holds the rows that
succeeded, each ``response: {status_code: 200, request_id, body}`` with ``body`` a
``chat.completion`` built from the stored outcome (message content and tool calls,
finish reason, usage, the model that answered; only the well-formed stored tool calls and
a finish reason of the chat vocabulary are shown, so a stored value left by rows
recorded before replies were checked cannot make a line the SDK rejects; a refusal is
stored as content with finish reason ``content_filter`` and shows as such). The error
file holds every other row,
``response: null`` and ``error: {code, message}``: a row that failed with Relay's error
code (``upstream_error``, ``internal_error``) and message, a row a cancel kept from
running ``batch_cancelled``, one past the completion window ``batch_expired``.

Files are streamed a ledger page at a time (:meth:`JobStore.answered_pages`), never held
whole. A batch's files exist once it has ended, when its outcomes no longer change, so
a file renders to the same bytes every time: its size is measured by rendering it once
(:func:`output_file`) and recorded with the file.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial

import orjson

from relay_batches.ledger.files import LinkedBatch, StoredFile
from relay_batches.ledger.jobs import AnsweredRow
from relay_batches.model import TERMINAL, Job, JobStatus
from relay_batches.services.ingest_api.deps import ApiDeps
from relay_batches.tool_calls import stored_finish_reason, stored_tool_calls

OUTPUT = "output"
ERROR = "error"
_SELECTIONS = {OUTPUT: "succeeded", ERROR: "unsucceeded"}
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


@dataclass(frozen=True)
class OutputFiles:
    """The ids (32-hex) of a batch's output and error files, None where it has none."""

    output: str | None
    error: str | None


def output_files(linked: LinkedBatch) -> OutputFiles:
    """Which files an ended batch has: an output file if a row succeeded, an error file
    if one did not; none while it runs or when its input failed validation."""
    job, link = linked.job, linked.link
    if job.status not in TERMINAL or link.errors is not None:
        return OutputFiles(None, None)
    has_errors = job.completed < job.total
    return OutputFiles(
        link.output_file_id if job.completed else None,
        link.error_file_id if has_errors else None,
    )


def kind_of(linked: LinkedBatch, file_id: str) -> str | None:
    """``output`` or ``error`` if ``file_id`` is one of the batch's existing files."""
    files = output_files(linked)
    if file_id == files.output:
        return OUTPUT
    if file_id == files.error:
        return ERROR
    return None


def filename_of(linked: LinkedBatch, kind: str) -> str:
    """OpenAI's names for a batch's files: ``batch_<id>_output.jsonl`` / ``_error.jsonl``."""
    return f"batch_{linked.job.id}_{kind}.jsonl"


def _line_id(prefix: str, job: Job, row: AnsweredRow) -> str:
    return f"{prefix}{job.id}{row.row_index:08x}"


def success_line(job: Job, row: AnsweredRow, created: int) -> dict[str, object]:
    """A succeeded row's line: a 200 whose body is a ``chat.completion``."""
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
    if kind == OUTPUT:
        created = int((job.completed_at or job.created_at).timestamp())
        return b"".join(dumps(success_line(job, r, created)) + b"\n" for r in rows)
    return b"".join(dumps(error_line(job, r)) + b"\n" for r in rows)


async def rendered(deps: ApiDeps, job: Job, kind: str) -> AsyncIterator[bytes]:
    """The file's content, a rendered page at a time (each rendered off the event loop)."""
    loop = asyncio.get_running_loop()
    async for page in deps.jobs.answered_pages(job, _SELECTIONS[kind]):
        yield await loop.run_in_executor(None, partial(render_page, job, kind, page))


async def output_file(deps: ApiDeps, linked: LinkedBatch, kind: str) -> StoredFile | None:
    """The batch's ``kind`` file, registered with its measured size the first time it
    is asked for (one rendering measures it while concurrent callers wait for it);
    None once deleted."""
    job = linked.job
    link = linked.link
    file_id = link.output_file_id if kind == OUTPUT else link.error_file_id

    async def measure() -> int:
        size = 0
        async for chunk in rendered(deps, job, kind):
            size += len(chunk)
        return size

    created = job.completed_at or job.created_at
    name = filename_of(linked, kind)
    return await deps.files.output_file_once(job.workspace_id, file_id, name, created, measure)
