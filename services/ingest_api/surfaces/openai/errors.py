"""The OpenAI-compatible surface's error object: the native one plus ``code`` (null)."""

from __future__ import annotations

from relay_batches.services.ingest_api.edge.middleware import error_type


def openai_error(status: int, message: str, param: str | None = None) -> dict[str, object]:
    """OpenAI's error object of ``status``: ``{error: {message, type, param, code}}``."""
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": None}}
