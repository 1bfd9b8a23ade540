"""The OpenAI surface's objects as the SDK's own types read them: batches in every job
status, output and error lines, and the OpenAPI fragment."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from openai.types import Batch
from openai.types.chat import ChatCompletion
from openai.types.shared import ErrorObject

from relay_batches.dialects.openai.render import ERROR, OUTPUT, render_page
from relay_batches.errors import ApiError
from relay_batches.ledger.files import BatchLink, LinkedBatch
from relay_batches.ledger.jobs import AnsweredRow
from relay_batches.model import Job, JobStatus
from relay_batches.services.ingest_api.openapi import load_document
from relay_batches.services.ingest_api.surfaces.openai.batches import batch_object
from relay_batches.services.ingest_api.surfaces.openai.files import DownloadGate
from relay_batches.services.ingest_api.surfaces.openai.output import output_files
from tests.helpers.fakes import UNUSABLE_STORED_TOOL_CALLS, answered_row

CREATED = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
ENDED = CREATED + timedelta(minutes=5)
HEX = "a" * 32
JOB = Job(
    id=HEX,
    workspace_id="b" * 32,
    name="in.jsonl",
    model="gpt-4o-mini",
    priority=0,
    status=JobStatus.RUNNING,
    total=3,
    completed=1,
    failed=1,
    dead_letter=0,
    webhook_url=None,
    cron=None,
    next_run_at=None,
    template_id=None,
    rows_batch_id="c" * 32,
    params="{}",
    error=None,
    created_at=CREATED,
    started_at=CREATED,
    completed_at=None,
    prompt_tokens=7,
    completion_tokens=3,
    expires_at=CREATED + timedelta(hours=24),
    metadata='{"team":"search"}',
)
LINK = BatchLink(HEX, "c" * 32, "d" * 32, "e" * 32, "/v1/chat/completions", "24h")


def linked(status: JobStatus, **changes: object) -> LinkedBatch:
    """The test job in ``status`` (ended at ENDED if terminal)."""
    ended = None if status in (JobStatus.QUEUED, JobStatus.RUNNING) else ENDED
    return LinkedBatch(replace(JOB, status=status, completed_at=ended, **changes), LINK)


@pytest.mark.parametrize(
    ("status", "expected", "stamp"),
    [
        (JobStatus.QUEUED, "in_progress", None),
        (JobStatus.RUNNING, "in_progress", None),
        (JobStatus.COMPLETED, "completed", "completed_at"),
        (JobStatus.FAILED, "failed", "failed_at"),
        (JobStatus.CANCELED, "cancelled", "cancelled_at"),
        (JobStatus.EXPIRED, "expired", "expired_at"),
    ],
)
def test_every_job_status_is_an_sdk_batch(
    status: JobStatus, expected: str, stamp: str | None
) -> None:
    raw = orjson.loads(orjson.dumps(batch_object(linked(status)).model_dump()))

    batch = Batch.model_validate(raw, strict=True)

    assert (batch.id, batch.status, batch.object) == (f"batch_{HEX}", expected, "batch")
    assert batch.created_at == int(CREATED.timestamp())
    assert batch.expires_at == int((CREATED + timedelta(hours=24)).timestamp())
    assert batch.metadata == {"team": "search"}
    assert batch.usage is not None and batch.usage.total_tokens == 10
    stamps = ("completed_at", "failed_at", "cancelled_at", "expired_at")
    assert {name for name in stamps if raw[name] is not None} == ({stamp} if stamp else set())
    if stamp:
        assert raw[stamp] == int(ENDED.timestamp())


def test_a_running_job_with_every_outcome_is_finalizing() -> None:
    batch = batch_object(linked(JobStatus.RUNNING, completed=2, failed=1))
    assert batch.status == "finalizing"


def test_cancelled_batches_were_cancelling_at_the_same_second() -> None:
    batch = batch_object(linked(JobStatus.CANCELED))
    assert batch.cancelling_at == batch.cancelled_at == int(ENDED.timestamp())


def test_files_exist_once_ended_for_what_happened() -> None:
    running = output_files(linked(JobStatus.RUNNING))
    assert (running.output, running.error) == (None, None)
    done = output_files(linked(JobStatus.COMPLETED, completed=3, failed=0))
    assert (done.output, done.error) == (LINK.output_file_id, None)
    none_ok = output_files(linked(JobStatus.COMPLETED, completed=0, failed=3))
    assert (none_ok.output, none_ok.error) == (None, LINK.error_file_id)
    bad_input = LinkedBatch(linked(JobStatus.FAILED).job, replace(LINK, errors="[]"))
    assert (output_files(bad_input).output, output_files(bad_input).error) == (None, None)


def answered(index: int, **outcome: object) -> AnsweredRow:
    """An input row with the given outcome fields (none: no outcome)."""
    return answered_row(index, f"r{index}", **{"done": bool(outcome), **outcome})


def test_output_lines_are_chat_completions_with_tool_calls() -> None:
    calls = '[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]'
    rows = [
        answered(
            0,
            content="hello",
            finish_reason="stop",
            model="sim-echo",
            prompt_tokens=3,
            completion_tokens=1,
        ),
        answered(1, content="", tool_calls=calls, finish_reason="tool_calls"),
    ]
    job = linked(JobStatus.COMPLETED).job

    lines = [orjson.loads(x) for x in render_page(job, OUTPUT, rows).splitlines()]

    bodies = [ChatCompletion.model_validate(x["response"]["body"], strict=True) for x in lines]
    assert bodies[0].choices[0].message.content == "hello"
    assert (bodies[0].model, bodies[0].usage and bodies[0].usage.total_tokens) == ("sim-echo", 4)
    message = bodies[1].choices[0].message
    assert message.content is None and message.tool_calls is not None
    assert message.tool_calls[0].id == "call_1"
    assert (bodies[1].model, bodies[1].choices[0].finish_reason) == ("gpt-4o-mini", "tool_calls")
    assert [x["response"]["status_code"] for x in lines] == [200, 200]
    assert lines[0]["id"] != lines[1]["id"] and lines[0]["error"] is None
    assert render_page(job, OUTPUT, rows) == render_page(job, OUTPUT, rows)  # sizes hold


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (JobStatus.CANCELED, "batch_cancelled"),
        (JobStatus.EXPIRED, "batch_expired"),
        (JobStatus.FAILED, "batch_failed"),
    ],
)
def test_error_lines_say_why_a_row_did_not_succeed(status: JobStatus, code: str) -> None:
    rows = [
        answered(0, error="upstream_error: sim: HTTP 429 slow down"),
        answered(1, error="internal_error: the reply could not be read"),
        answered(2),
    ]

    lines = [orjson.loads(x) for x in render_page(linked(status).job, ERROR, rows).splitlines()]

    failed = [x["response"] for x in lines[:2]]
    assert [(x["custom_id"], x["error"]) for x in lines[:2]] == [("r0", None), ("r1", None)]
    assert [r["status_code"] for r in failed] == [429, 500]
    assert [r["request_id"] for r in failed] == [f"req_{HEX}{i:08x}" for i in range(2)]
    errors = [ErrorObject.model_validate(r["body"]["error"], strict=True) for r in failed]
    assert [(e.code, e.type, e.param) for e in errors] == [
        ("upstream_error", "invalid_request_error", None),
        ("internal_error", "server_error", None),
    ]
    assert errors[0].message == "upstream_error: sim: HTTP 429 slow down"
    assert (lines[2]["custom_id"], lines[2]["response"], lines[2]["error"]["code"]) == (
        "r2",
        None,
        code,
    )


def test_every_openai_operation_answers_errors_in_openai_shape() -> None:
    document = load_document()
    paths = {p: item for p, item in document["paths"].items() if p.startswith("/openai/v1/")}
    assert set(paths) == {
        "/openai/v1/files",
        "/openai/v1/files/{file_id}",
        "/openai/v1/files/{file_id}/content",
        "/openai/v1/batches",
        "/openai/v1/batches/{batch_id}",
        "/openai/v1/batches/{batch_id}/cancel",
        "/openai/v1/models",
        "/openai/v1/models/{model}",
        "/openai/v1/webhook_endpoints",
        "/openai/v1/webhook_endpoints/{id}",
    }
    error = document["components"]["schemas"]["OpenAIError"]
    assert error["properties"]["error"] == {"$ref": "#/components/schemas/OpenAIErrorDetail"}
    for item in paths.values():
        for method, operation in item.items():
            if method == "parameters":
                continue
            for status, response in operation["responses"].items():
                if int(status) >= 400:
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/OpenAIError"}


GOOD_CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
# Stored tool calls that rows recorded before replies were checked may hold.
BAD_STORED_TOOL_CALLS = [(stored, []) for stored in UNUSABLE_STORED_TOOL_CALLS] + [
    (
        '[{"id":"c","type":"function","function":{"name":"f","arguments":{"a":1}}}]',
        [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}],
    ),
    ("[1," + orjson.dumps(GOOD_CALL).decode() + "]", [GOOD_CALL]),
]


@pytest.mark.parametrize(("stored", "shown"), BAD_STORED_TOOL_CALLS)
def test_output_lines_stay_valid_chat_completions_whatever_the_stored_tool_calls(
    stored: str, shown: list[dict[str, object]]
) -> None:
    rows = [answered(0, content="", tool_calls=stored, finish_reason="tool_calls")]

    (line,) = [orjson.loads(x) for x in render_page(JOB, OUTPUT, rows).splitlines()]

    body = ChatCompletion.model_validate(line["response"]["body"], strict=True)
    message = body.choices[0].message
    assert line["response"]["body"]["choices"][0]["message"]["tool_calls"] == (shown or None)
    assert message.content == (None if shown else "")
    assert body.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(("stored", "shown"), [("abort", "stop"), ("function_call", "stop")])
def test_output_lines_show_only_chat_finish_reasons(stored: str, shown: str) -> None:
    rows = [answered(0, content="hi", finish_reason=stored)]

    (line,) = [orjson.loads(x) for x in render_page(JOB, OUTPUT, rows).splitlines()]

    body = ChatCompletion.model_validate(line["response"]["body"], strict=True)
    assert body.choices[0].finish_reason == shown


def test_a_refusal_shows_as_content_filtered_content() -> None:
    rows = [answered(0, content="I can't help with that.", finish_reason="content_filter")]

    (line,) = [orjson.loads(x) for x in render_page(JOB, OUTPUT, rows).splitlines()]

    choice = ChatCompletion.model_validate(line["response"]["body"], strict=True).choices[0]
    assert (choice.message.content, choice.finish_reason) == (
        "I can't help with that.",
        "content_filter",
    )


def test_a_workspace_holds_at_most_its_share_of_content_streams() -> None:
    gate = DownloadGate(per_workspace=2)
    with gate.hold("w1"), gate.hold("w1"), gate.hold("w2"):
        with pytest.raises(ApiError) as refused:
            with gate.hold("w1"):
                pytest.fail("a third stream of w1 was let in")
        assert (refused.value.status, gate.open) == (503, {"w1": 2, "w2": 1})
    assert gate.open == {}
    with gate.hold("w1"):
        assert gate.open == {"w1": 1}
