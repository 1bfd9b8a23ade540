"""The request-body policy of every endpoint that takes one, in one place.

- 415 unless the body has the endpoint's ``Content-Type`` and an encoding we inflate
  (none, ``identity``, ``gzip`` or ``deflate``; aiohttp inflates those incrementally as
  the body is read, and every byte counted here is an inflated one);
- 415 naming it for a JSON body declaring a ``charset`` other than UTF-8 (JSON is read
  as UTF-8, RFC 8259 section 8.1; a body declared UTF-16 is refused, never misread);
- 413 past the body limit, declared or found while reading, so a small gzip of a huge
  body stops at the limit;
- 400 for a corrupt encoding (bad gzip, bad chunked framing);
- 408 when the client sends no byte of its body for the read timeout, or, once the
  read timeout has passed, falls behind the minimum average rate (so a body of n bytes
  must be complete within ``read_timeout_s + n / min_rate`` seconds);
- 503 with ``Retry-After`` when a large body arrives while every large-body slot is
  held, or while its workspace already holds one (a body is large past
  :attr:`BodyGate.large_bytes`, declared or counted chunk by chunk as it is read).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TypeVar

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from relay_batches.errors import ApiError, invalid

ENCODINGS = frozenset({"identity", "gzip", "deflate"})
UTF_8 = frozenset({"utf-8", "utf8"})  # the charset names a JSON body may declare
RETRY_AFTER_S = 2
T = TypeVar("T")


def too_large(max_bytes: int) -> ApiError:
    """The 413 for a body over ``max_bytes`` (declared, chunked, or found while streaming)."""
    return ApiError(413, f"request body exceeds {max_bytes} bytes")


class BodyGate:
    """How long a body may take, and how many large bodies may be held at once: at most
    ``slots`` in all and one per workspace.

    Single event loop: the slot counts need no lock.
    """

    def __init__(
        self,
        read_timeout_s: float = 30.0,
        large_bytes: int = 1024 * 1024,
        slots: int = 2,
        min_rate: float = 64 * 1024,
    ) -> None:
        self.read_timeout_s = read_timeout_s
        self.large_bytes = large_bytes
        self.slots = slots
        self.min_rate = min_rate  # bytes per second, on average, after read_timeout_s
        self.in_use = 0
        self.holders: set[str] = set()  # the workspaces holding a slot

    @asynccontextmanager
    async def admit(self, workspace_id: str) -> AsyncIterator[BodyTicket]:
        """A ticket for one request's body, holding a slot (if it took one) until exit."""
        ticket = BodyTicket(self, workspace_id)
        try:
            yield ticket
        finally:
            ticket.release()


class BodyTicket:
    """One request's claim on the gate: counts its body as it arrives, takes a slot once
    the body is large, and bounds how long each read may wait."""

    def __init__(self, gate: BodyGate, workspace_id: str) -> None:
        self._gate = gate
        self._workspace_id = workspace_id
        self._held = False
        self._started = asyncio.get_running_loop().time()
        self.received = 0  # bytes of the (inflated) body read so far

    @property
    def large(self) -> bool:
        """True once the body holds a large-body slot."""
        return self._held

    def grow(self, size: int) -> None:
        """The body is at least ``size`` bytes: take a slot if that makes it large."""
        gate = self._gate
        if self._held or size <= gate.large_bytes:
            return
        if self._workspace_id in gate.holders:
            raise ApiError(
                503,
                "this workspace already has a large request in progress,"
                f" retry in {RETRY_AFTER_S} s",
            )
        if gate.in_use >= gate.slots:
            raise ApiError(503, f"too many large requests in progress, retry in {RETRY_AFTER_S} s")
        gate.in_use += 1
        gate.holders.add(self._workspace_id)
        self._held = True

    def count(self, size: int) -> None:
        """``size`` more bytes of the body have been read."""
        self.received += size
        self.grow(self.received)

    def release(self) -> None:
        """Give the slot back (idempotent)."""
        if self._held:
            self._gate.in_use -= 1
            self._gate.holders.discard(self._workspace_id)
            self._held = False

    async def within(self, step: Awaitable[T]) -> T:
        """Await one read of the body: 408 when nothing arrives for the read timeout, or
        when the body would fall behind the minimum rate first."""
        gate = self._gate
        elapsed = asyncio.get_running_loop().time() - self._started
        behind_at = gate.read_timeout_s + self.received / gate.min_rate
        wait = min(gate.read_timeout_s, behind_at - elapsed)
        try:
            async with asyncio.timeout(max(wait, 0.0)):
                return await step
        except TimeoutError:
            if wait < gate.read_timeout_s:
                raise ApiError(
                    408, f"request body too slow: under {gate.min_rate:g} bytes/s on average"
                ) from None
            raise ApiError(
                408, f"request body stalled: nothing received for {gate.read_timeout_s:g} s"
            ) from None


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


def check_charset(request: web.Request) -> None:
    """415 naming the ``charset`` parameter of the ``Content-Type`` unless it is absent
    or UTF-8 (any case, quoted or not, or ``utf8``): the body is read as UTF-8."""
    charset = request.charset
    if charset is not None and charset.strip().lower() not in UTF_8:
        raise ApiError(
            415, f"charset {_printable(charset)} is not supported: send UTF-8", "Content-Type"
        )


@contextmanager
def body_errors() -> Iterator[None]:
    """Translate what reading a body may raise into the API's 400."""
    try:
        yield
    except HttpProcessingError as exc:  # bad gzip/deflate data, broken chunked framing
        raise invalid(f"request body cannot be decoded: {_printable(exc.message)}") from None
    except RequestPayloadError as exc:  # the same, as the server hands them to a handler
        cause = exc.__cause__ if isinstance(exc.__cause__, HttpProcessingError) else None
        detail = cause.message if cause is not None else str(exc)
        raise invalid(f"request body cannot be decoded: {_printable(detail)}") from None


def _printable(text: str, limit: int = 200) -> str:
    return " ".join("".join(ch for ch in text[:limit] if ch.isprintable()).split())


async def read_chunk(request: web.Request, ticket: BodyTicket) -> bytes:
    """The next chunk of the (inflated) body, b'' at its end, counted on ``ticket``; 408
    when it stalls or is too slow, 400 for a corrupt encoding."""
    with body_errors():
        chunk = await ticket.within(request.content.readany())
    ticket.count(len(chunk))
    return chunk


async def read_body(
    request: web.Request, content_type: str, max_bytes: int, ticket: BodyTicket
) -> bytearray:
    """The whole inflated body, checked by :func:`check_body` and :func:`check_charset`
    and bounded by ``max_bytes`` as it arrives."""
    check_body(request, content_type, max_bytes)
    check_charset(request)
    ticket.grow(request.content_length or 0)
    buffer = bytearray()
    while chunk := await read_chunk(request, ticket):
        if len(buffer) + len(chunk) > max_bytes:
            raise too_large(max_bytes)
        buffer += chunk
    return buffer
