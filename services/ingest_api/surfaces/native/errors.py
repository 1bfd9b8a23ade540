"""The native error object (API.md): ``{error: {type, message, param}}``.

It is also the server's own, for what no surface serves: the probes, the panel, the
document, an unknown path and a request aiohttp cannot parse.
"""

from __future__ import annotations

from aiohttp import web

from relay_batches.services.ingest_api.edge.middleware import error_response as shaped
from relay_batches.services.ingest_api.edge.middleware import error_type


def native_error(status: int, message: str, param: str | None = None) -> dict[str, object]:
    """The native error object of ``status``."""
    return {"error": {"type": error_type(status), "message": message, "param": param}}


def error_response(status: int, message: str, param: str | None = None) -> web.Response:
    """The native error object as a response (a 503 with ``Retry-After``)."""
    return shaped(status, message, param, native_error)
