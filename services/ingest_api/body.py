"""The request-body policy of every endpoint that takes one: 415 and 413, in one place."""

from __future__ import annotations

from aiohttp import web

from relay_batches.errors import ApiError


def too_large(max_bytes: int) -> ApiError:
    """The 413 for a body over ``max_bytes`` (declared, chunked, or found while streaming)."""
    return ApiError(413, f"request body exceeds {max_bytes} bytes")


def check_body(request: web.Request, content_type: str, max_bytes: int) -> None:
    """415 unless the body is ``content_type``; 413 when its declared length is too large."""
    if request.content_type != content_type:
        raise ApiError(415, f"Content-Type must be {content_type}")
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        raise too_large(max_bytes)


async def read_body(request: web.Request, content_type: str, max_bytes: int) -> bytes:
    """The whole body, checked by :func:`check_body` and bounded by ``max_bytes``."""
    check_body(request, content_type, max_bytes)
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_large(max_bytes) from None
    if len(raw) > max_bytes:  # a chunked body has no Content-Length to check up front
        raise too_large(max_bytes)
    return raw
