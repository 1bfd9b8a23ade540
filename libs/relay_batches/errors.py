"""The small error tree shared by every service.

``ApiError`` is what the HTTP edge turns into a surface's error object (docs/api/index.md);
``TransientError`` and ``PermanentError`` classify failures inside the pipeline (retry vs give up).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    408: "request_timeout",
    409: "conflict_error",
    413: "request_too_large",
    415: "unsupported_media_type",
    500: "internal_error",
}


class RelayError(Exception):
    """Base of every error Relay raises on purpose."""


class TransientError(RelayError):
    """A failure worth retrying (network, timeout, broker or database briefly away)."""


class PermanentError(RelayError):
    """A failure that will not go away by retrying."""


class UnstorableError(PermanentError):
    """Some values of a list handed over can never be stored: ``positions`` are their
    indexes in that list; everything else of the list was recorded."""

    def __init__(self, positions: Iterable[int], reason: str) -> None:
        super().__init__(reason)
        self.positions = frozenset(positions)
        self.reason = reason


class HandBack(RelayError):
    """The handler did not start on the delivery (the service is stopping): return it
    to the queue at once, untouched, for another consumer."""


class ConflictError(RelayError):
    """A guarded state transition found the row in another state."""


@dataclass
class ApiError(RelayError):
    """A client-facing error: HTTP status, message and the offending field, if any."""

    status: int
    message: str
    param: str | None = None

    def __post_init__(self) -> None:
        super().__init__(self.message)

    @property
    def type(self) -> str:
        """The native error ``type`` for this status (docs/api/index.md)."""
        return ERROR_TYPES.get(self.status, "invalid_request_error")

    def body(self) -> dict[str, dict[str, str | None]]:
        """The native error object (docs/api/index.md)."""
        return {"error": {"type": self.type, "message": self.message, "param": self.param}}


def invalid(message: str, param: str | None = None) -> ApiError:
    """A 400 ``invalid_request_error``."""
    return ApiError(400, message, param)
