"""The chat tool-calls shape: a reply's calls held to it exactly, a stored value read
leniently."""

from __future__ import annotations

from typing import Any

import pytest

from relay_batches.tool_calls import checked_tool_calls, stored_finish_reason, stored_tool_calls

CALL = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.mark.parametrize(
    ("value", "checked"),
    [
        (None, []),
        ([], []),
        ([CALL], [CALL]),
        ([{**CALL, "index": 0}], [CALL]),
        ([1], None),
        ("x", None),
        ([{**CALL, "id": None}], None),
        ([{**CALL, "function": {"name": "f", "arguments": None}}], None),
    ],
)
def test_checked_tool_calls(value: Any, checked: list[dict[str, Any]] | None) -> None:
    assert checked_tool_calls(value) == checked


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        (None, []),
        ("", []),
        ("null", []),
        ("not json", []),
        ("[1]", []),
        ('{"a":1}', []),
        (
            '[{"id":"c","type":"function","function":{"name":"f","arguments":[1]}}]',
            [{**CALL, "function": {"name": "f", "arguments": "[1]"}}],
        ),
        ('[{"id":"c","type":"function","function":{"name":"f"}}]', []),
    ],
)
def test_stored_tool_calls(text: str | None, calls: list[dict[str, Any]]) -> None:
    assert stored_tool_calls(text) == calls


def test_stored_finish_reason() -> None:
    assert [stored_finish_reason(v) for v in ("stop", "abort", None)] == ["stop", None, None]
