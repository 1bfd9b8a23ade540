"""Unit tests of the bus messages: round-trips, the raw-JSON row embedding, and rejects."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest

from relay_batches.messages import (
    SCHEMA_VERSION,
    DecodedSlice,
    DispatchWakeup,
    JobEvent,
    MessageError,
    OutcomesMessage,
    RowOutcome,
    RowRequest,
    SliceMessage,
    SliceRow,
)

MESSAGES_1 = '[{"role":"user","content":"hi"}]'
MESSAGES_2 = '[{"role":"system","content":"be brief"},{"role":"user","content":"ünï ✓"}]'


def body(**fields: object) -> bytes:
    return orjson.dumps(fields)


# --- round-trips -------------------------------------------------------------------------


def test_dispatch_wakeup_round_trip() -> None:
    message = DispatchWakeup("b1", 7)
    assert orjson.loads(message.encode()) == {
        "v": SCHEMA_VERSION,
        "kind": "dispatch",
        "batch_id": "b1",
        "priority": 7,
    }
    assert DispatchWakeup.decode(message.encode()) == message


def test_job_event_round_trip() -> None:
    message = JobEvent("b1", "running", 10, 4, 1)
    assert orjson.loads(message.encode()) == {
        "v": SCHEMA_VERSION,
        "kind": "job",
        "batch_id": "b1",
        "status": "running",
        "total": 10,
        "completed": 4,
        "failed": 1,
    }
    assert JobEvent.decode(message.encode()) == message


def test_outcome_of_nine_fields_decodes_without_an_answer() -> None:
    """A worker from before whole answers sends nine fields per outcome."""
    raw = orjson.dumps(
        {
            "v": SCHEMA_VERSION,
            "kind": "results",
            "outcomes": [["b", 0, "hi", None, 1, False, "d", 1, 2]],
        }
    )
    assert OutcomesMessage.decode(raw).outcomes == (
        RowOutcome("b", 0, "hi", None, 1, False, "d", 1, 2),
    )


def test_an_outcome_with_a_whole_reply_carries_it_as_a_fifteenth_field() -> None:
    body = '{"choices":[{"index":0},{"index":1}]}'
    outcome = RowOutcome("b", 0, "hi", None, 1, body=body)
    assert outcome.as_list()[-1] == body and len(outcome.as_list()) == 15
    assert len(RowOutcome("b", 0, "hi", None, 1).as_list()) == 14  # none: nothing more
    decoded = OutcomesMessage.decode(OutcomesMessage((outcome,)).encode())
    assert decoded.outcomes == (outcome,)


def test_row_request_of_an_object_carries_its_model_and_params() -> None:
    raw = SliceMessage(
        "b",
        "m",
        (SliceRow(0, '{"messages":[{"role":"user","content":"x"}],"model":"m2","seed":1}'),),
    ).encode()
    assert SliceMessage.decode(raw).rows == (
        (0, RowRequest([{"role": "user", "content": "x"}], "m2", {"seed": 1})),
    )


def test_outcome_batch_round_trip() -> None:
    outcomes = (
        RowOutcome("b1", 0, "hello", None, 1, False, "primary", 3, 5, None, "stop", "m-1", 12, 0.5),
        RowOutcome("b1", 1, None, "upstream_error: x: HTTP 503: busy", 4, True, None, 0, 0),
        RowOutcome("b2", 9, "", None, 2, tool_calls='[{"id":"c"}]', finish_reason="tool_calls"),
    )
    message = OutcomesMessage(outcomes)
    # A worker encodes each outcome once as it comes, and joins them into the same body.
    parts = [orjson.dumps(o.as_list()) for o in outcomes]
    assert OutcomesMessage.encode_parts(parts) == message.encode()
    assert OutcomesMessage.decode(OutcomesMessage.encode_parts([])).outcomes == ()
    assert orjson.loads(message.encode()) == {
        "v": SCHEMA_VERSION,
        "kind": "results",
        "outcomes": [
            ["b1", 0, "hello", None, 1, False, "primary", 3, 5, None, "stop", "m-1", 12, 0.5],
            [
                "b1",
                1,
                None,
                "upstream_error: x: HTTP 503: busy",
                4,
                True,
                *[None, 0, 0],
                *[None] * 5,
            ],
            [
                "b2",
                9,
                "",
                None,
                2,
                False,
                None,
                0,
                0,
                '[{"id":"c"}]',
                "tool_calls",
                None,
                None,
                None,
            ],
        ],
    }
    assert OutcomesMessage.decode(message.encode()) == message


def test_outcome_of_twelve_fields_decodes_without_details() -> None:
    """A worker from before row details sends twelve fields per outcome."""
    raw = orjson.dumps(
        {
            "v": SCHEMA_VERSION,
            "kind": "results",
            "outcomes": [["b", 0, "hi", None, 1, False, "d", 1, 2, None, "stop", "m"]],
        }
    )
    assert OutcomesMessage.decode(raw).outcomes == (
        RowOutcome("b", 0, "hi", None, 1, False, "d", 1, 2, None, "stop", "m"),
    )


def test_empty_outcome_batch_round_trip() -> None:
    assert OutcomesMessage.decode(OutcomesMessage(()).encode()) == OutcomesMessage(())


def test_row_task_embeds_messages_raw_and_decodes_to_lists() -> None:
    task = SliceMessage(
        "b1",
        "gpt-4o-mini",
        (SliceRow(4, MESSAGES_1), SliceRow(5, MESSAGES_2)),
        params_json='{"temperature":0.5}',
        level=3,
        sent_at=1700000000.25,
        owner="dispatcher-1",
        expires_at=1700000060.5,
        workspace="ws-1",
    )
    encoded = task.encode()
    # The row messages travel as the very JSON text they were given, not re-serialised.
    assert MESSAGES_1.encode() in encoded
    assert MESSAGES_2.encode() in encoded
    assert orjson.loads(encoded) == {
        "v": SCHEMA_VERSION,
        "kind": "rows",
        "batch_id": "b1",
        "model": "gpt-4o-mini",
        "params": {"temperature": 0.5},
        "rows": [[4, orjson.loads(MESSAGES_1)], [5, orjson.loads(MESSAGES_2)]],
        "level": 3,
        "sent_at": 1700000000.25,
        "owner": "dispatcher-1",
        "expires_at": 1700000060.5,
        "workspace": "ws-1",
    }
    decoded = SliceMessage.decode(encoded)
    assert decoded == DecodedSlice(
        "b1",
        "gpt-4o-mini",
        ((4, RowRequest(orjson.loads(MESSAGES_1))), (5, RowRequest(orjson.loads(MESSAGES_2)))),
        {"temperature": 0.5},
        3,
        1700000000.25,
        "dispatcher-1",
        1700000060.5,
        "ws-1",
    )
    assert all(isinstance(request.messages, list) for _, request in decoded.rows)
    assert decoded.tenant == "ws-1"
    assert decoded.with_rows(decoded.rows).workspace == "ws-1"


def test_a_slice_without_a_workspace_keeps_to_its_job() -> None:
    # A slice that names no workspace (one the offloader forwards) has its calls made over
    # connections of its job's own: never those of another workspace's jobs.
    decoded = SliceMessage.decode(SliceMessage("b1", "m", (SliceRow(0, MESSAGES_1),)).encode())
    assert (decoded.workspace, decoded.tenant) == ("", "job:b1")


def test_a_slice_resent_by_stall_recovery_says_so_and_keeps_saying_it_when_handed_over() -> None:
    first = SliceMessage("b1", "m", (SliceRow(0, MESSAGES_1),))
    assert b"resent" not in first.encode()  # a first send carries no flag
    assert SliceMessage.decode(first.encode()).resent is False
    decoded = SliceMessage.decode(SliceMessage("b1", "m", (), resent=True).encode())
    assert decoded.resent is True
    assert decoded.with_rows(()).resent is True


def test_row_task_default_params() -> None:
    decoded = SliceMessage.decode(SliceMessage("b1", "m", (SliceRow(0, MESSAGES_1),)).encode())
    assert decoded.params == {}
    assert decoded.rows == ((0, RowRequest([{"role": "user", "content": "hi"}])),)


def test_row_task_null_params_decode_as_empty() -> None:
    raw = body(v=SCHEMA_VERSION, kind="rows", batch_id="b", model="m", params=None, rows=[])
    assert SliceMessage.decode(raw) == DecodedSlice("b", "m", (), {})


# --- rejects -----------------------------------------------------------------------------

Decode = Callable[[bytes], object]

DECODERS: list[Decode] = [
    DispatchWakeup.decode,
    SliceMessage.decode,
    OutcomesMessage.decode,
    JobEvent.decode,
]


@pytest.mark.parametrize("decode", DECODERS)
@pytest.mark.parametrize("raw", [b"", b"not json", b"{", b"\xff\xfe"])
def test_bad_json_is_rejected(decode: Decode, raw: bytes) -> None:
    with pytest.raises(MessageError, match="body is not JSON"):
        decode(raw)


@pytest.mark.parametrize("decode", DECODERS)
@pytest.mark.parametrize("raw", [b"[]", b"1", b'"x"', b"null"])
def test_non_object_is_rejected(decode: Decode, raw: bytes) -> None:
    with pytest.raises(MessageError, match="body is not an object"):
        decode(raw)


@pytest.mark.parametrize(
    ("cls", "message"),
    [
        (DispatchWakeup, DispatchWakeup("b", 1)),
        (JobEvent, JobEvent("b", "running", 1, 0, 0)),
        (OutcomesMessage, OutcomesMessage(())),
        (SliceMessage, SliceMessage("b", "m", ())),
    ],
)
@pytest.mark.parametrize("version", [None, 0, 2, "1"])
def test_wrong_version_is_rejected(cls: Any, message: Any, version: object) -> None:
    data = orjson.loads(message.encode())
    if version is None:
        del data["v"]
    else:
        data["v"] = version
    with pytest.raises(MessageError, match=f"unsupported schema version {version!r}"):
        cls.decode(orjson.dumps(data))


def test_wrong_kind_is_rejected() -> None:
    with pytest.raises(MessageError) as err:
        JobEvent.decode(DispatchWakeup("b", 1).encode())
    assert str(err.value) == "expected job, got 'dispatch'"
    with pytest.raises(MessageError, match="expected rows, got 'results'"):
        SliceMessage.decode(OutcomesMessage(()).encode())
    with pytest.raises(MessageError, match="expected dispatch, got None"):
        DispatchWakeup.decode(body(v=SCHEMA_VERSION, batch_id="b", priority=1))


@pytest.mark.parametrize(
    ("decode", "fields"),
    [
        (DispatchWakeup.decode, {"kind": "dispatch", "batch_id": "b"}),
        (DispatchWakeup.decode, {"kind": "dispatch", "batch_id": "b", "priority": "high"}),
        (JobEvent.decode, {"kind": "job", "batch_id": "b", "status": "running", "total": 1}),
        (OutcomesMessage.decode, {"kind": "results"}),
        (OutcomesMessage.decode, {"kind": "results", "outcomes": [["b", 0, "x", None, 1]]}),
        (OutcomesMessage.decode, {"kind": "results", "outcomes": [1]}),
        (SliceMessage.decode, {"kind": "rows", "batch_id": "b", "model": "m"}),
        (SliceMessage.decode, {"kind": "rows", "model": "m", "rows": []}),
        (SliceMessage.decode, {"kind": "rows", "batch_id": "b", "model": "m", "rows": [[0]]}),
        (SliceMessage.decode, {"kind": "rows", "batch_id": "b", "model": "m", "rows": [[0, 5]]}),
        (SliceMessage.decode, {"kind": "rows", "batch_id": "b", "model": "m", "rows": [[0, "hi"]]}),
        (
            SliceMessage.decode,
            {"kind": "rows", "batch_id": "b", "model": "m", "rows": [[0, {"role": "user"}]]},
        ),
        (SliceMessage.decode, {"kind": "rows", "batch_id": "b", "model": "m", "rows": [["x", []]]}),
        (
            SliceMessage.decode,
            {"kind": "rows", "batch_id": "b", "model": "m", "rows": [], "params": [1]},
        ),
    ],
)
def test_missing_or_malformed_field_is_rejected(decode: Decode, fields: dict[str, Any]) -> None:
    with pytest.raises(MessageError):
        decode(body(v=SCHEMA_VERSION, **fields))


def test_row_messages_that_are_not_an_array_are_rejected() -> None:
    raw = body(v=SCHEMA_VERSION, kind="rows", batch_id="b", model="m", rows=[[0, "hi"]])
    with pytest.raises(MessageError, match="row request is not an array or object: str"):
        SliceMessage.decode(raw)
