"""Every surface's error object can be encoded, whatever text it echoes: a lone surrogate
(from a key of a payload not built by orjson) is written as its backslash escape."""

from __future__ import annotations

import orjson
import pytest

from relay_batches.services.ingest_api.edge.middleware import ErrorShape, error_response
from relay_batches.services.ingest_api.surfaces.anthropic.errors import anthropic_error
from relay_batches.services.ingest_api.surfaces.native.errors import native_error
from relay_batches.services.ingest_api.surfaces.openai.errors import openai_error


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        (
            native_error,
            {
                "error": {
                    "type": "invalid_request_error",
                    "message": "'\\udc00' é is bad",
                    "param": "a.\\udc00",
                }
            },
        ),
        (
            openai_error,
            {
                "error": {
                    "message": "'\\udc00' é is bad",
                    "type": "invalid_request_error",
                    "param": "a.\\udc00",
                    "code": None,
                }
            },
        ),
        (
            anthropic_error,
            {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": "'\\udc00' é is bad"},
            },
        ),
    ],
)
def test_a_lone_surrogate_is_escaped_in_every_surfaces_error(
    shape: ErrorShape, expected: dict[str, object]
) -> None:
    response = error_response(400, "'\udc00' é is bad", "a.\udc00", shape)

    assert (response.status, response.content_type) == (400, "application/json")
    assert response.body is not None
    assert orjson.loads(response.body) == expected  # type: ignore[arg-type]


def test_text_that_encodes_is_echoed_unchanged() -> None:
    body = native_error(400, "name 'é😀\\u' must be short", "name")
    assert body == {
        "error": {
            "type": "invalid_request_error",
            "message": "name 'é😀\\u' must be short",
            "param": "name",
        }
    }
