"""The Anthropic-compatible surface's error object: ``{type: "error", error: {type, message}}``."""

from __future__ import annotations

from relay_batches.services.ingest_api.edge.middleware import error_type

# The error ``type`` of Anthropic's error object for each status.
ANTHROPIC_ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


def anthropic_error(status: int, message: str, param: str | None = None) -> dict[str, object]:
    """Anthropic's error object of ``status`` (it names no parameter)."""
    kind = ANTHROPIC_ERROR_TYPES.get(status, "api_error" if status >= 500 else error_type(status))
    return {"type": "error", "error": {"type": kind, "message": message}}
