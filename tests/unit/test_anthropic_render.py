"""The Anthropic surface's shapes: a job as a Message Batch and its outcomes as results
lines, each validated by the official SDK's own types (a wrong type or literal fails),
and create bodies translated into rows or refused naming the field."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from anthropic.types.messages import (
    DeletedMessageBatch,
    MessageBatch,
    MessageBatchIndividualResponse,
    MessageBatchSucceededResult,
)
from anthropic.types.shared import ErrorResponse

from relay_batches.dialects.anthropic.render import (
    batch_object,
    job_id_of,
    message_id,
    public_id,
    result_line,
)
from relay_batches.dialects.anthropic.shapes import (
    AnthropicDeletedMessageBatch,
    AnthropicError,
    AnthropicErrorDetail,
    AnthropicResultLine,
)
from relay_batches.errors import ApiError
from relay_batches.ledger.jobs import AnsweredRow
from relay_batches.model import Job, JobStatus
from relay_batches.services.ingest_api.openapi import load_document
from relay_batches.services.ingest_api.rows.validation import (
    SubmitLimits,
)
from relay_batches.services.ingest_api.surfaces.anthropic.create import scan_requests
from relay_batches.services.ingest_api.surfaces.anthropic.errors import anthropic_error
from tests.helpers.fakes import UNUSABLE_STORED_TOOL_CALLS, answered_row

JOB_ID = "0123456789abcdef0123456789abcdef"
CREATED = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
ENDED = CREATED + timedelta(minutes=5)
ORIGIN = "http://relay.test:8080"
RESULTS_URL = f"{ORIGIN}/anthropic/v1/messages/batches/msgbatch_{JOB_ID}/results"


def job(status: JobStatus, total: int = 10, completed: int = 0, failed: int = 0) -> Job:
    terminal = status not in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.SCHEDULED)
    return Job(
        id=JOB_ID,
        workspace_id="f" * 32,
        name="n",
        model="gpt-4o-mini",
        priority=0,
        status=status,
        total=total,
        completed=completed,
        failed=failed,
        dead_letter=0,
        webhook_url=None,
        cron=None,
        next_run_at=None,
        template_id=None,
        rows_batch_id=JOB_ID,
        params="{}",
        error="no deployment answered" if status == JobStatus.FAILED else None,
        created_at=CREATED,
        started_at=CREATED,
        completed_at=ENDED if terminal else None,
        expires_at=CREATED + timedelta(hours=24),
    )


def row(index: int = 0, **outcome: Any) -> AnsweredRow:
    """An input row; one given an outcome is done after one attempt, not dead-lettered."""
    if outcome:
        outcome = {"attempts": 1, "dead_letter": False, "done": True, **outcome}
    return answered_row(index, f"req-{index}", **outcome)


def as_sdk_line(line: dict[str, Any]) -> MessageBatchIndividualResponse:
    """The line through JSON, validated by the SDK and by our own model."""
    raw = orjson.loads(orjson.dumps(line))
    AnthropicResultLine.model_validate(raw)
    return MessageBatchIndividualResponse.model_validate(raw)


# --- the batch -----------------------------------------------------------------------


def test_a_running_batch_is_in_progress_with_its_unfinished_rows_processing() -> None:
    raw = orjson.loads(orjson.dumps(batch_object(job(JobStatus.RUNNING, 10, 3, 2), ORIGIN)))

    assert raw == {
        "id": f"msgbatch_{JOB_ID}",
        "type": "message_batch",
        "processing_status": "in_progress",
        "request_counts": {
            "processing": 5,
            "succeeded": 3,
            "errored": 2,
            "canceled": 0,
            "expired": 0,
        },
        "created_at": "2026-12-01T12:00:00Z",
        "expires_at": "2026-12-02T12:00:00Z",
        "ended_at": None,
        "cancel_initiated_at": None,
        "archived_at": None,
        "results_url": None,
    }
    batch = MessageBatch.model_validate(raw)
    assert batch.created_at == CREATED


@pytest.mark.parametrize(
    ("status", "counts", "cancel_initiated"),
    [
        (JobStatus.COMPLETED, (0, 7, 3, 0, 0), False),
        (JobStatus.CANCELED, (0, 4, 1, 5, 0), True),
        (JobStatus.EXPIRED, (0, 4, 1, 0, 5), False),
        (JobStatus.FAILED, (0, 4, 6, 0, 0), False),
    ],
)
def test_every_terminal_status_is_ended_with_its_rows_counted(
    status: JobStatus, counts: tuple[int, ...], cancel_initiated: bool
) -> None:
    done = (7, 3) if status == JobStatus.COMPLETED else (4, 1)
    raw = orjson.loads(orjson.dumps(batch_object(job(status, 10, *done), ORIGIN)))

    batch = MessageBatch.model_validate(raw)
    assert batch.processing_status == "ended"
    got = batch.request_counts
    assert (got.processing, got.succeeded, got.errored, got.canceled, got.expired) == counts
    assert batch.ended_at == ENDED
    assert batch.cancel_initiated_at == (ENDED if cancel_initiated else None)
    assert batch.results_url == RESULTS_URL
    assert batch.archived_at is None


def test_a_job_without_a_deadline_shows_the_anthropic_24_hours() -> None:
    native = job(JobStatus.QUEUED)
    native = Job(**{**native.__dict__, "expires_at": None})

    batch = MessageBatch.model_validate(batch_object(native, ORIGIN))

    assert batch.expires_at == CREATED + timedelta(hours=24)


def test_ids_map_one_to_one_and_anything_else_is_no_id() -> None:
    assert public_id(JOB_ID) == f"msgbatch_{JOB_ID}"
    assert job_id_of(f"msgbatch_{JOB_ID}") == JOB_ID
    for other in (JOB_ID, f"batch_{JOB_ID}", f"msgbatch_{JOB_ID.upper()}", "msgbatch_", ""):
        assert job_id_of(other) is None


def test_the_deleted_answer_and_the_error_object_are_the_sdk_types() -> None:
    deleted = AnthropicDeletedMessageBatch(id=public_id(JOB_ID)).model_dump(mode="json")
    assert DeletedMessageBatch.model_validate(deleted).type == "message_batch_deleted"
    for status in (400, 401, 404, 409, 503):
        body = anthropic_error(status, "nope")
        assert ErrorResponse.model_validate(body).error.message == "nope"
        AnthropicError(error=AnthropicErrorDetail.model_validate(body["error"]))


# --- results lines -------------------------------------------------------------------


def test_a_text_answer_is_a_succeeded_message() -> None:
    answered = row(
        3,
        content="echo: hi",
        finish_reason="stop",
        model="sim-echo",
        prompt_tokens=7,
        completion_tokens=2,
    )

    line = result_line(job(JobStatus.COMPLETED), answered)

    assert line == {
        "custom_id": "req-3",
        "result": {
            "type": "succeeded",
            "message": {
                "id": message_id(JOB_ID, 3),
                "type": "message",
                "role": "assistant",
                "model": "sim-echo",
                "content": [{"type": "text", "text": "echo: hi"}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 7, "output_tokens": 2},
            },
        },
    }
    assert as_sdk_line(line).result.type == "succeeded"
    assert message_id(JOB_ID, 3) == message_id(JOB_ID, 3) != message_id(JOB_ID, 4)
    assert message_id(JOB_ID, 3).startswith("msg_")


def test_tool_calls_become_tool_use_blocks_with_their_arguments_as_input() -> None:
    calls = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "days": 2}'},
        },
        {"id": "toolu_2", "type": "function", "function": {"name": "now", "arguments": "{}"}},
    ]
    answered = row(0, content="", tool_calls=orjson.dumps(calls).decode(), finish_reason=None)

    line = result_line(job(JobStatus.COMPLETED), answered)

    message = as_sdk_line(line).result.message  # type: ignore[union-attr]
    assert [block.model_dump(exclude_none=True) for block in message.content] == [
        {
            "type": "tool_use",
            "id": "call_1",
            "name": "get_weather",
            "input": {"city": "Oslo", "days": 2},
        },
        {"type": "tool_use", "id": "toolu_2", "name": "now", "input": {}},
    ]
    assert message.stop_reason == "tool_use"
    assert message.model == "gpt-4o-mini"  # no model stored: the job's


def test_text_before_tool_calls_is_kept_and_bad_arguments_are_kept_whole() -> None:
    calls = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1, 2"}}]
    answered = row(
        0,
        content="Let me look.",
        tool_calls=orjson.dumps(calls).decode(),
        finish_reason="tool_calls",
    )

    message = as_sdk_line(result_line(job(JobStatus.COMPLETED), answered)).result.message  # type: ignore[union-attr]

    assert [block.type for block in message.content] == ["text", "tool_use"]
    assert message.content[1].input == {"raw_arguments": "[1, 2"}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("finish_reason", "stop_reason"),
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
        ("content_filter", "refusal"),
        (None, "end_turn"),
    ],
)
def test_finish_reasons_map_back_to_stop_reasons(
    finish_reason: str | None, stop_reason: str
) -> None:
    answered = row(0, content="x", finish_reason=finish_reason)

    message = as_sdk_line(result_line(job(JobStatus.COMPLETED), answered)).result.message  # type: ignore[union-attr]

    assert message.stop_reason == stop_reason


@pytest.mark.parametrize(
    ("error", "error_type"),
    [
        ("upstream_error: sim: HTTP 400 bad request", "invalid_request_error"),
        ("upstream_error: HTTP 429 slow down", "rate_limit_error"),
        ("upstream_error: HTTP 529 overloaded", "overloaded_error"),
        ("upstream_error: connect timeout", "api_error"),
    ],
)
def test_a_row_error_is_an_errored_result_with_anthropics_error_object(
    error: str, error_type: str
) -> None:
    line = result_line(job(JobStatus.COMPLETED), row(1, error=error, dead_letter=True))

    assert line["result"] == {
        "type": "errored",
        "error": {"type": "error", "error": {"type": error_type, "message": error}},
    }
    assert as_sdk_line(line).result.error.error.type == error_type  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("status", "result"),
    [
        (JobStatus.CANCELED, {"type": "canceled"}),
        (JobStatus.EXPIRED, {"type": "expired"}),
        (
            JobStatus.FAILED,
            {
                "type": "errored",
                "error": {
                    "type": "error",
                    "error": {"type": "api_error", "message": "no deployment answered"},
                },
            },
        ),
    ],
)
def test_rows_that_never_ran_show_how_their_batch_ended(
    status: JobStatus, result: dict[str, Any]
) -> None:
    line = result_line(job(status), row(2))

    assert line == {"custom_id": "req-2", "result": result}
    assert as_sdk_line(line).result.type == result["type"]


# --- create bodies -------------------------------------------------------------------

LIMITS = SubmitLimits(max_rows=3, max_content_bytes=1000)
KNOWN = frozenset({"gpt-4o-mini", "sim-claude"})


def body(*requests: object, **extra: object) -> bytes:
    return orjson.dumps({"requests": list(requests), **extra})


def request(custom_id: str = "a", model: str = "gpt-4o-mini", **params: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "params": {
            "model": model,
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "hi"}],
            **params,
        },
    }


def refusal(raw: bytes) -> tuple[str | None, str]:
    with pytest.raises(ApiError) as caught:
        scan_requests(raw, LIMITS, KNOWN)
    assert caught.value.status == 400
    return caught.value.param, caught.value.message


def test_requests_become_rows_that_each_keep_their_model() -> None:
    rows = scan_requests(
        body(request("a"), request("b", "sim-claude", system="Be brief.")), LIMITS, KNOWN
    )

    assert [(r.custom_id, r.model) for r in rows] == [("a", "gpt-4o-mini"), ("b", "sim-claude")]
    stored = orjson.loads(rows[1].request_json)
    assert stored["model"] == "sim-claude"
    assert stored["messages"][0] == {"role": "system", "content": "Be brief."}


@pytest.mark.parametrize(
    ("raw", "param", "message"),
    [
        (b"[1]", None, "request body must be a JSON object"),
        (b"{", None, "request body must be JSON"),
        (b"{}", "requests", "requests: field required"),
        (body(), "requests", "requests: must be a non-empty array"),
        (orjson.dumps({"requests": {}}), "requests", "requests: must be a non-empty array"),
        (
            body(request(), model="x"),
            "model",
            "'model': extra inputs are not permitted (fields: requests)",
        ),
    ],
)
def test_bad_bodies_are_refused_naming_the_field(
    raw: bytes, param: str | None, message: str
) -> None:
    assert refusal(raw) == (param, message)


def test_a_bad_request_is_refused_naming_its_field_with_its_index() -> None:
    bad = request("b")
    bad["params"]["messages"][0]["content"] = 5

    param, message = refusal(body(request("a"), bad))

    assert param == "requests[1].params.messages[0].content"
    assert message.startswith("requests[1].params.messages[0].content: ")


def test_an_unknown_model_and_a_repeated_custom_id_name_their_request() -> None:
    assert refusal(body(request("a"), request("b", "nope")))[0] == "requests[1].params.model"
    param, message = refusal(body(request("a"), request("b"), request("a")))
    assert param == "requests[2].custom_id"
    assert "requests[0].custom_id" in message


def test_more_requests_than_the_limit_are_refused() -> None:
    param, message = refusal(body(*(request(f"r{i}") for i in range(4))))

    assert param == "requests"
    assert "at most 3" in message


def test_a_value_the_row_encoder_cannot_store_is_refused_not_a_500() -> None:
    turn = request("a")
    turn["params"]["messages"] = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"n": 2**70}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}],
        },
    ]
    turn["params"]["tools"] = [{"name": "f", "input_schema": {"type": "object"}}]

    param, message = refusal(json.dumps({"requests": [turn]}).encode())  # orjson refuses it

    assert param == "requests[0].params"
    assert "cannot be stored" in message


def test_the_documented_error_responses_are_the_error_object_the_middleware_sends() -> None:
    document = load_document()
    operations = [
        (path, method, operation)
        for path, item in document["paths"].items()
        if path.startswith("/anthropic/")
        for method, operation in item.items()
        if method != "parameters"
    ]
    assert len(operations) == 8  # batches: create, list, get, delete, cancel, results; models
    for path, method, operation in operations:
        for code, response in operation["responses"].items():
            schema = response["content"]
            if int(code) < 400:
                continue
            assert schema["application/json"]["schema"] == {
                "$ref": "#/components/schemas/AnthropicError"
            }, (method, path, code)
            body = anthropic_error(int(code), "x")
            AnthropicError.model_validate(body)
            if int(code) == 413:  # Anthropic's documented type, missing from the SDK's union
                assert body["error"]["type"] == "request_too_large"  # type: ignore[index]
            else:
                assert ErrorResponse.model_validate(body).type == "error"


# Stored tool calls that rows recorded before replies were checked may hold, and the
# tool_use blocks each shows.
BAD_STORED_TOOL_CALLS = [(stored, []) for stored in UNUSABLE_STORED_TOOL_CALLS] + [
    (
        '[{"id":"c","type":"function","function":{"name":"f","arguments":{"a":1}}}]',
        [{"type": "tool_use", "id": "c", "name": "f", "input": {"a": 1}}],
    ),
    (
        '[1,{"id":"c","type":"function","function":{"name":"f","arguments":"[2]"}}]',
        [{"type": "tool_use", "id": "c", "name": "f", "input": {"raw_arguments": "[2]"}}],
    ),
]


@pytest.mark.parametrize(("stored", "blocks"), BAD_STORED_TOOL_CALLS)
def test_results_lines_stay_valid_whatever_the_stored_tool_calls(
    stored: str, blocks: list[dict[str, Any]]
) -> None:
    line = result_line(
        job(JobStatus.COMPLETED), row(0, content="", tool_calls=stored, finish_reason="tool_calls")
    )

    result = as_sdk_line(line).result
    content = orjson.loads(orjson.dumps(line))["result"]["message"]["content"]
    assert content == (blocks or [{"type": "text", "text": ""}])
    assert isinstance(result, MessageBatchSucceededResult)
    assert result.message.stop_reason == "tool_use"


def test_a_refusal_shows_as_text_with_the_refusal_stop_reason() -> None:
    line = result_line(
        job(JobStatus.COMPLETED), row(0, content="I can't help.", finish_reason="content_filter")
    )

    result = as_sdk_line(line).result
    assert isinstance(result, MessageBatchSucceededResult)
    assert result.message.stop_reason == "refusal"
    assert line["result"]["message"]["content"] == [{"type": "text", "text": "I can't help."}]
