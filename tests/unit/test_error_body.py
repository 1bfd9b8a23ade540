"""Every surface's error object can be encoded, whatever text it echoes: a lone surrogate
(from a key of a payload not built by orjson) is written as its backslash escape."""

from __future__ import annotations

import orjson
import pytest

from relay_batches.services.ingest_api.edge.middleware import error_body, error_response


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (
            "/v1/batches",
            {
                "error": {
                    "type": "invalid_request_error",
                    "message": "'\\udc00' é is bad",
                    "param": "a.\\udc00",
                }
            },
        ),
        (
            "/openai/v1/batches",
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
            "/anthropic/v1/messages/batches",
            {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": "'\\udc00' é is bad"},
            },
        ),
    ],
)
def test_a_lone_surrogate_is_escaped_in_every_surfaces_error(
    path: str, expected: dict[str, object]
) -> None:
    response = error_response(400, "'\udc00' é is bad", "a.\udc00", path)

    assert (response.status, response.content_type) == (400, "application/json")
    assert response.body is not None
    assert orjson.loads(response.body) == expected  # type: ignore[arg-type]


def test_text_that_encodes_is_echoed_unchanged() -> None:
    body = error_body("/v1/", 400, "name 'é😀\\u' must be short", "name")
    assert body == {
        "error": {
            "type": "invalid_request_error",
            "message": "name 'é😀\\u' must be short",
            "param": "name",
        }
    }
