"""Unit tests of the Anthropic create body's scan: the per-row byte cap."""

from __future__ import annotations

import orjson
import pytest

from relay_batches.errors import ApiError
from relay_batches.services.ingest_api.rows.validation import (
    SubmitLimits,
)
from relay_batches.services.ingest_api.surfaces.anthropic.create import scan_requests


def body(*contents: str) -> bytes:
    """A create body with one request per content."""
    return orjson.dumps(
        {
            "requests": [
                {
                    "custom_id": f"r{i}",
                    "params": {
                        "model": "claude-test",
                        "max_tokens": 8,
                        "messages": [{"role": "user", "content": text}],
                    },
                }
                for i, text in enumerate(contents)
            ]
        }
    )


def test_a_request_over_the_row_byte_cap_is_a_400_naming_it() -> None:
    limits = SubmitLimits(max_rows=10, max_content_bytes=10_000, max_row_bytes=300)
    with pytest.raises(ApiError) as err:
        scan_requests(body("short", "x" * 400), limits, {"claude-test"})
    assert (err.value.status, err.value.param) == (400, "requests[1]")
    assert err.value.message == "requests[1]: is larger than 300 bytes"


def test_requests_within_the_cap_are_rows() -> None:
    limits = SubmitLimits(max_rows=10, max_content_bytes=10_000, max_row_bytes=300)
    rows = scan_requests(body("short", "y" * 100), limits, {"claude-test"})
    assert len(rows) == 2
