"""The request-body policy of every endpoint that takes one, in one place.

- 415 unless the body has the endpoint's ``Content-Type`` and an encoding we inflate
  (none, ``identity``, ``gzip`` or ``deflate``; aiohttp inflates those incrementally as
  the body is read, and every byte counted here is an inflated one);
- 413 past the body limit, declared or found while reading, so a small gzip of a huge
  body stops at the limit;
- 400 for a corrupt encoding (bad gzip, bad chunked framing);
- 408 when the client sends no byte of its body for the read timeout;
- 503 with ``Retry-After`` when a large body arrives while every large-body slot is
  held (a body is large past :attr:`BodyGate.large_bytes`; declared or while reading).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from relay_batches.errors import ApiError, invalid

ENCODINGS = frozenset({"identity", "gzip", "deflate"})
RETRY_AFTER_S = 2


def too_large(max_bytes: int) -> ApiError:
    """The 413 for a body over ``max_bytes`` (declared, chunked, or found while streaming)."""
    return ApiError(413, f"request body exceeds {max_bytes} bytes")


class BodyGate:
    """How long a body may stall, and how many large bodies may be held at once.

    Single event loop: the slot count needs no lock.
    """

    def __init__(
        self, read_timeout_s: float = 30.0, large_bytes: int = 1024 * 1024, slots: int = 2
    ) -> None:
        self.read_timeout_s = read_timeout_s
        self.large_bytes = large_bytes
        self.slots = slots
        self.in_use = 0

    @asynccontextmanager
    async def admit(self) -> AsyncIterator[BodyTicket]:
        """A ticket for one request's body, holding a slot (if it took one) until exit."""
        ticket = BodyTicket(self)
        try:
            yield ticket
        finally:
            ticket.release()


class BodyTicket:
    """One request's claim on the gate: takes a slot once its body is large."""

    def __init__(self, gate: BodyGate) -> None:
        self._gate = gate
        self._held = False

    @property
    def read_timeout_s(self) -> float:
        """The gate's stall timeout."""
        return self._gate.read_timeout_s

    def grow(self, size: int) -> None:
        """The body is at least ``size`` bytes: take a slot if that makes it large."""
        gate = self._gate
        if self._held or size <= gate.large_bytes:
            return
        if gate.in_use >= gate.slots:
            raise ApiError(503, f"too many large requests in progress, retry in {RETRY_AFTER_S} s")
        gate.in_use += 1
        self._held = True

    def release(self) -> None:
        """Give the slot back (idempotent)."""
        if self._held:
            self._gate.in_use -= 1
            self._held = False


def check_body(request: web.Request, content_type: str, max_bytes: int) -> None:
    """415 unless the body is ``content_type`` in an encoding we inflate; 413 when its
    declared length is too large."""
    if request.content_type != content_type:
        raise ApiError(415, f"Content-Type must be {content_type}")
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ENCODINGS:
        raise ApiError(
            415, "Content-Encoding must be gzip, deflate or identity", "Content-Encoding"
        )
    declared = request.content_length
    if declared is not None and declared > max_bytes:
        raise too_large(max_bytes)


@contextmanager
def body_errors(timeout_s: float) -> Iterator[None]:
    """Translate what reading a body may raise into the API's 400 and 408."""
    try:
        yield
    except TimeoutError:
        raise ApiError(408, f"request body stalled: nothing received for {timeout_s:g} s") from None
    except HttpProcessingError as exc:  # bad gzip/deflate data, broken chunked framing
        raise invalid(f"request body cannot be decoded: {_printable(exc.message)}") from None
    except RequestPayloadError as exc:  # the same, as the server hands them to a handler
        cause = exc.__cause__ if isinstance(exc.__cause__, HttpProcessingError) else None
        detail = cause.message if cause is not None else str(exc)
        raise invalid(f"request body cannot be decoded: {_printable(detail)}") from None


def _printable(text: str, limit: int = 200) -> str:
    return " ".join("".join(ch for ch in text[:limit] if ch.isprintable()).split())


async def read_chunk(request: web.Request, timeout_s: float) -> bytes:
    """The next chunk of the (inflated) body, b'' at its end; 408 after ``timeout_s``
    without a byte, 400 for a corrupt encoding."""
    with body_errors(timeout_s):
        async with asyncio.timeout(timeout_s):
            return await request.content.readany()


async def read_body(
    request: web.Request, content_type: str, max_bytes: int, ticket: BodyTicket
) -> bytearray:
    """The whole inflated body, checked by :func:`check_body` and bounded by
    ``max_bytes`` as it arrives."""
    check_body(request, content_type, max_bytes)
    ticket.grow(request.content_length or 0)
    buffer = bytearray()
    timeout_s = ticket.read_timeout_s
    while chunk := await read_chunk(request, timeout_s):
        if len(buffer) + len(chunk) > max_bytes:
            raise too_large(max_bytes)
        buffer += chunk
        ticket.grow(len(buffer))
    return buffer
