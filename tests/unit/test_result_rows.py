"""Native result rows: the stored tool calls are read back, so a bad stored value (left by
rows recorded before replies were checked) still gives a valid document, never a broken
stream."""

from __future__ import annotations

import orjson
import pytest

from relay_batches.ledger.jobs import ResultRow
from relay_batches.services.ingest_api.surfaces.native.results import row_object

CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def test_a_success_with_tool_calls_carries_them() -> None:
    row = ResultRow(0, "a", "", None, orjson.dumps([CALL]).decode())
    assert orjson.loads(orjson.dumps(row_object(row))) == {
        "custom_id": "a",
        "content": "",
        "tool_calls": [CALL],
    }


@pytest.mark.parametrize(
    ("stored", "shown"),
    [
        ("not json", None),
        ('[{"id":"c"', None),
        ("[1]", None),
        ('{"id":"call_1"}', None),
        ('"call_1"', None),
        ('[{"function":"x"}]', None),
        (
            '[{"id":"c","type":"function","function":{"name":"f","arguments":{"a":1}}}]',
            [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}],
        ),
        ("[1," + orjson.dumps(CALL).decode() + "]", [CALL]),
    ],
)
def test_bad_stored_tool_calls_still_give_a_valid_document(
    stored: str, shown: list[dict[str, object]] | None
) -> None:
    rows = [ResultRow(0, "a", "", None, stored), ResultRow(1, "b", "ok", None)]
    # The page as stream_list splices it into the document.
    document = b'{"id":"j","data":[' + orjson.dumps([row_object(r) for r in rows])[1:-1] + b"]}"

    data = orjson.loads(document)["data"]

    expected = {"custom_id": "a", "content": ""}
    if shown is not None:
        expected["tool_calls"] = shown  # type: ignore[assignment]
    assert data == [expected, {"custom_id": "b", "content": "ok"}]
