"""The upstream calls' HTTP/1.1 client: keep-alive connections per origin, one request at
a time on each, every reply read into memory up to a cap.

Why not aiohttp's client here: the row-worker's CPU per row is mostly its upstream call,
and measured side by side on the 2-core development machine against the simulator (one
process, uvloop, 32 calls in flight) a call through ``aiohttp.ClientSession.post`` cost
about 125 µs of CPU and one through this client about 45 µs (JSON encoding and decoding
included in both). The router needs little of a general client: a POST of a bytes body,
the status, one header (``Retry-After``) and a bounded body. Everything else (the
offloader's provider clients, webhooks) stays on aiohttp.

What it does: ``http`` and ``https`` (the default SSL context: certificates and host name
checked, SNI); a request handed to the transport whole (its body is in memory already)
and never sent a second time (the router retries, with its backoff, limiter and attempt
count); replies framed by ``Content-Length``, by the chunked transfer coding or by the end of the
connection (RFC 9112, section 6.3); interim ``1xx`` replies skipped; ``gzip`` and
``deflate`` content codings inflated up to the cap (none is asked for: no
``Accept-Encoding`` is sent, so a server should not use one); the whole call, connecting
included, within one total timeout. A connection goes back to its origin's pool only after
a reply read exactly to its end with keep-alive; one idle longer than ``keepalive_s`` is
closed instead of reused. What it does not do: proxies (the aiohttp session it replaces
never read the proxy environment either), redirects (the router never followed them),
cookies, HTTP/2.

Failures are :class:`UpstreamConnectionError` (``ConnectFailed``, ``ServerDisconnected``,
``BadReply``) or ``TimeoutError``; a call that fails, times out or is cancelled aborts its
connection, so a late reply can never be read as the answer to the next request.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024  # a reply's status line and headers together
MAX_CHUNK_LINE_BYTES = 4096  # a chunk-size line (extensions included) or a trailer line
MAX_TRAILER_BYTES = 64 * 1024
MAX_INTERIM_REPLIES = 16  # 1xx replies before the final one
# An idle connection older than this is closed, not reused: below uvicorn's 5 s (vLLM),
# so a server closing an idle connection seldom races a request sent on it (such a
# request fails as ServerDisconnected, and the router retries it).
KEEPALIVE_S = 4.0
MAX_IDLE_PER_ORIGIN = 256
USER_AGENT = "relay-batches"
_ORIGIN_CACHE = 256  # parsed URLs kept (the routes hold a few)
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")


class UpstreamConnectionError(Exception):
    """The call failed on the connection: nothing or only part of a reply was read."""


class ConnectFailed(UpstreamConnectionError):
    """No connection: refused, unreachable, a name that does not resolve, TLS refused."""


class ServerDisconnected(UpstreamConnectionError):
    """The server closed the connection before the reply was complete."""


class BadReply(UpstreamConnectionError):
    """What the server sent is not an HTTP/1.x reply this client can frame."""


@dataclass(frozen=True, slots=True)
class HttpReply:
    """A reply: status, headers (names lower-cased; a repeated one's values joined with
    ", ", as one list) and body (inflated; ``limit + 1`` bytes when it was longer than the
    call's limit)."""

    status: int
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class _Origin:
    """Where a URL's requests go, and the parts of its request line and head."""

    key: tuple[str, str, int]
    host: str
    port: int
    tls: bool
    target: bytes  # path and query, as the request line sends them
    host_header: bytes


def _origin_of(url: str) -> _Origin:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    tls = parts.scheme == "https"
    default = 443 if tls else 80
    port = parts.port or default
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    host_header = shown if port == default else f"{shown}:{port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _Origin(
        (parts.scheme, host, port),
        host,
        port,
        tls,
        target.encode("ascii"),
        host_header.encode("idna" if not host.isascii() else "ascii"),
    )


def encode_head(
    origin_target: bytes, host: bytes, headers: Mapping[str, str], length: int
) -> bytes:
    """The request line and headers of a POST of ``length`` bytes; a header name or value
    holding CR, LF or NUL is refused (it would split the head)."""
    lines = [
        b"POST ",
        origin_target,
        b" HTTP/1.1\r\nHost: ",
        host,
        b"\r\nContent-Length: ",
        str(length).encode(),
        b"\r\n",
    ]
    agent = False
    for name, value in headers.items():
        if _unsafe(name) or _unsafe(value) or not name or ":" in name:
            raise ValueError(f"header {name!r} cannot be sent")
        lowered = name.lower()
        if lowered in ("host", "content-length", "transfer-encoding", "connection"):
            continue  # this client frames the request itself
        agent = agent or lowered == "user-agent"
        lines.append(f"{name}: {value}\r\n".encode("latin-1"))
    if not agent:
        lines.append(b"User-Agent: " + USER_AGENT.encode() + b"\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


def _unsafe(text: str) -> bool:
    return "\r" in text or "\n" in text or "\0" in text


class ReplyReader:
    """Frames one reply from the bytes a connection receives (no I/O: tests feed it).

    ``feed`` returns True once the reply is complete; :attr:`reply` then holds it and
    :attr:`reusable` says whether the connection may carry another request (the reply was
    framed by length or chunks, the server did not ask to close, and no byte beyond the
    reply arrived). ``eof`` is the connection's end: True if that completes the reply
    (framing by the connection's end), else it raises :class:`ServerDisconnected`.
    Malformed input raises :class:`BadReply`.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buffer = bytearray()
        self._state = "head"
        self._status = 0
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._size = 0
        self._remaining = 0  # of the body (by length) or of the current chunk
        self._keep_alive = True
        self._over = False
        self._scanned = 0  # of the buffer, searched for the head's end without finding it
        self._interim = 0
        self._trailers = 0
        self.reply: HttpReply | None = None
        self.reusable = False

    def feed(self, data: bytes) -> bool:
        """Take the next bytes received; True once the reply is complete."""
        if self.reply is not None:
            self.reusable = False  # bytes nobody asked for: the connection is not trusted
            return True
        self._buffer += data
        while True:
            progressed = getattr(self, f"_on_{self._state}")()
            if self._state == "done":
                if self._buffer:
                    self.reusable = False
                return True
            if not progressed:
                return False

    def eof(self) -> bool:
        """The connection ended: True if that completes the reply."""
        if self.reply is not None:
            return True
        if self._state == "until_eof":
            self._finish()
            return True
        raise ServerDisconnected("connection closed before the reply was complete")

    def _on_head(self) -> bool:
        end = self._buffer.find(b"\r\n\r\n", max(0, self._scanned - 3))
        if end < 0:
            self._scanned = len(self._buffer)
            if len(self._buffer) > MAX_HEAD_BYTES:
                raise BadReply(f"reply head longer than {MAX_HEAD_BYTES} bytes")
            return False
        self._scanned = 0
        if end > MAX_HEAD_BYTES:
            raise BadReply(f"reply head longer than {MAX_HEAD_BYTES} bytes")
        head = bytes(self._buffer[:end])
        del self._buffer[: end + 4]
        lines = head.split(b"\r\n")
        version, status = _status_line(lines[0])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or name != name.strip() or b" " in name:
                raise BadReply(f"malformed header line {line[:80]!r}")
            key = name.decode("latin-1").lower()
            text = value.strip(b" \t").decode("latin-1")
            # A repeated field is one list (RFC 9110, 5.3): two lengths are then refused.
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        if 100 <= status < 200:
            if status == 101:
                raise BadReply("the server switched protocols")
            self._interim += 1
            if self._interim > MAX_INTERIM_REPLIES:
                raise BadReply(f"more than {MAX_INTERIM_REPLIES} interim replies")
            return True  # an interim reply: the final one follows
        self._status, self._headers = status, headers
        tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        if version == b"HTTP/1.0":
            self._keep_alive = "keep-alive" in tokens
        else:
            self._keep_alive = "close" not in tokens
        self._frame_body(headers)
        return True

    def _frame_body(self, headers: dict[str, str]) -> None:
        coding = headers.get("transfer-encoding")
        length = headers.get("content-length")
        if self._status in (204, 304):
            self._finish()
        elif coding is not None:
            # No TE is sent, so chunked is the only transfer coding a server may use.
            if coding.strip().lower() != "chunked":
                raise BadReply(f"unsupported Transfer-Encoding {coding[:40]!r}")
            self._state = "chunk_size"
            if length is not None:
                self._keep_alive = False  # both framings sent: never trust what follows
        elif length is not None:
            values = {v.strip() for v in length.split(",")}
            value = next(iter(values))
            if len(values) != 1 or not (value.isascii() and value.isdigit() and len(value) <= 18):
                raise BadReply(f"bad Content-Length {length[:40]!r}")
            self._remaining = int(value)
            self._state = "length"
            if self._remaining == 0:
                self._finish()
        else:
            self._state = "until_eof"
            self._keep_alive = False  # the connection's end frames it: never reused

    def _on_length(self) -> bool:
        if not self._take_remaining():
            return False
        if self._remaining == 0 or self._over:
            self._finish()
        return True

    def _take_remaining(self) -> bool:
        """Take what the buffer holds of the ``_remaining`` bytes; False if it is empty."""
        if not self._buffer:
            return False
        take = min(self._remaining, len(self._buffer))
        self._take(bytes(self._buffer[:take]))
        del self._buffer[:take]
        self._remaining -= take
        return True

    def _on_until_eof(self) -> bool:
        if not self._buffer:
            return False
        self._take(bytes(self._buffer))
        self._buffer.clear()
        if self._over:
            self._finish()
        return True

    def _on_chunk_size(self) -> bool:
        line = self._line()
        if line is None:
            return False
        size = line.split(b";", 1)[0].strip(b" \t")
        if not _CHUNK_SIZE.fullmatch(size):
            raise BadReply(f"bad chunk size {line[:40]!r}")
        self._remaining = int(size, 16)
        self._state = "trailers" if self._remaining == 0 else "chunk_data"
        return True

    def _on_chunk_data(self) -> bool:
        if not self._take_remaining():
            return False
        if self._over:
            self._finish()
        elif self._remaining == 0:
            self._state = "chunk_end"
        return True

    def _on_chunk_end(self) -> bool:
        if len(self._buffer) < 2:
            return False
        if self._buffer[:2] != b"\r\n":
            raise BadReply("chunk not followed by CRLF")
        del self._buffer[:2]
        self._state = "chunk_size"
        return True

    def _on_trailers(self) -> bool:
        line = self._line()
        if line is None:
            return False
        if not line:
            self._finish()
        self._trailers += len(line) + 2
        if self._trailers > MAX_TRAILER_BYTES:
            raise BadReply(f"trailers longer than {MAX_TRAILER_BYTES} bytes")
        return True

    def _on_done(self) -> bool:
        return False

    def _line(self) -> bytes | None:
        end = self._buffer.find(b"\r\n")
        if end < 0:
            if len(self._buffer) > MAX_CHUNK_LINE_BYTES:
                raise BadReply(f"chunk line longer than {MAX_CHUNK_LINE_BYTES} bytes")
            return None
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 2]
        return line

    def _take(self, data: bytes) -> None:
        room = self._limit + 1 - self._size
        if len(data) >= room:
            data, self._over = data[:room], True
        self._body.append(data)
        self._size += len(data)

    def _finish(self) -> None:
        self._state = "done"
        body = b"".join(self._body)
        self._body = []
        coding = self._headers.get("content-encoding", "").strip().lower()
        # A body cut at the cap stays coded: limit + 1 bytes say it was too long.
        if coding in ("gzip", "x-gzip", "deflate") and body and not self._over:
            body = _inflate(body, coding, self._limit)
        self.reply = HttpReply(self._status, self._headers, body)
        self.reusable = self._keep_alive and not self._over


def _status_line(line: bytes) -> tuple[bytes, int]:
    parts = line.split(b" ", 2)
    if len(parts) < 2 or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0"):
        raise BadReply(f"not an HTTP/1.x status line: {line[:80]!r}")
    code = parts[1]
    if len(code) != 3 or not code.isdigit() or code < b"100":
        raise BadReply(f"bad status code {code[:10]!r}")
    return parts[0], int(code)


def _inflate(body: bytes, coding: str, limit: int) -> bytes:
    """The body inflated, at most ``limit + 1`` bytes; a body that is not what its coding
    says is a :class:`BadReply`."""
    wbits = 16 + zlib.MAX_WBITS if coding != "deflate" else zlib.MAX_WBITS
    try:
        return _inflated(body, wbits, limit)
    except zlib.error:
        if coding != "deflate":
            raise BadReply(f"body is not valid {coding}") from None
    try:  # "deflate" sent as a raw stream, as some servers do
        return _inflated(body, -zlib.MAX_WBITS, limit)
    except zlib.error:
        raise BadReply("body is not valid deflate") from None


def _inflated(body: bytes, wbits: int, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits)
    out = inflater.decompress(body, limit + 1)
    if len(out) > limit:
        return out  # too long: the caller refuses it by its length
    if not inflater.eof or inflater.unused_data:
        raise zlib.error("truncated, or data after the end of the stream")
    return out


class _Connection(asyncio.Protocol):
    """One keep-alive connection: at most one request in flight."""

    def __init__(self, client: Http1Client, origin_key: tuple[str, str, int]) -> None:
        self._client = client
        self.origin_key = origin_key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._reader: ReplyReader | None = None
        self._done: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport; they have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        if reader is None:  # nothing was asked: an idle connection must stay silent
            self.abort()
            return
        try:
            done = reader.feed(data)
        except UpstreamConnectionError as exc:
            self._fail(exc)
            return
        except Exception as exc:  # never out of a protocol callback: the call fails instead
            self._fail(BadReply(f"reply could not be read: {exc!r}"))
            return
        if done and self._done is not None and not self._done.done():
            self._done.set_result(None)

    def eof_received(self) -> bool | None:
        self._end(None)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._client.forget(self)
        self._end(exc)

    def _end(self, exc: Exception | None) -> None:
        reader, done = self._reader, self._done
        if reader is None or done is None or done.done():
            return
        try:
            reader.eof()
        except UpstreamConnectionError as error:
            if exc is not None:
                error.__cause__ = exc
            self._fail(error)
            return
        done.set_result(None)

    def _time_out(self, done: asyncio.Future[None]) -> None:
        if done is self._done and not done.done():  # not a reply that came meanwhile
            self._fail(TimeoutError("no reply before the deadline"))

    def _fail(self, exc: BaseException) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(exc)
        self.abort()

    def abort(self, error: UpstreamConnectionError | None = None) -> None:
        """Drop the connection at once; nothing more is read from it. A reply still
        awaited fails with ``error`` (its caller is waiting) or, without one, is
        cancelled (its caller is gone or already failing)."""
        self.closed = True
        if self._done is not None and not self._done.done():
            if error is None:
                self._done.cancel()
            else:
                self._done.set_exception(error)
        if self.transport is not None:
            self.transport.abort()

    async def exchange(
        self, head: bytes, body: bytes, limit: int, deadline: float
    ) -> tuple[HttpReply, bool]:
        """Send one request; the reply and whether the connection may be reused. Past
        ``deadline`` (the loop's clock) the call fails with ``TimeoutError``."""
        assert self.transport is not None
        if self.closed or self.transport.is_closing():
            raise ServerDisconnected("connection closed before the request was sent")
        loop = asyncio.get_running_loop()
        reader = self._reader = ReplyReader(limit)
        done = self._done = loop.create_future()
        # Written whole (the transport buffers what the socket does not take yet: the
        # body is in memory already); the reply may come before all of it is sent.
        self.transport.writelines((head, body))
        timer = loop.call_at(deadline, self._time_out, done)
        try:
            await done
        finally:
            timer.cancel()
        self._reader = self._done = None
        assert reader.reply is not None
        # Bytes of this request still unsent when the reply came would be read by the
        # server as the start of the next one: such a connection is not reused.
        unsent = self.transport.get_write_buffer_size() > 0
        return reader.reply, reader.reusable and not self.closed and not unsent


class Http1Client:
    """POSTs over pooled HTTP/1.1 connections (see the module's docstring)."""

    def __init__(
        self, keepalive_s: float = KEEPALIVE_S, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self._keepalive_s = keepalive_s
        self._ssl = ssl_context
        self._origins: dict[str, _Origin] = {}
        self._idle: dict[tuple[str, str, int], dict[_Connection, None]] = {}
        self._busy: set[_Connection] = set()
        self._closed = False

    async def post(
        self, url: str, headers: Mapping[str, str], body: bytes, timeout_s: float, limit: int
    ) -> HttpReply:
        """POST ``body`` to ``url``; the reply, its body read up to ``limit`` bytes (then
        ``limit + 1``). Raises :class:`UpstreamConnectionError` or ``TimeoutError`` (the
        whole call, connecting included, past ``timeout_s``)."""
        origin = self._origin(url)
        head = encode_head(origin.target, origin.host_header, headers, len(body))
        # One deadline for the whole call (a timer per exchange, not asyncio.timeout's
        # task bookkeeping: this is the row-worker's hot path).
        deadline = asyncio.get_running_loop().time() + timeout_s
        # Never sent again here, whatever failed (a POST may have been taken up): the
        # router retries with its backoff, its limiter and its attempt count.
        connection = await self._acquire(origin, deadline)
        reusable = False
        try:
            reply, reusable = await connection.exchange(head, body, limit, deadline)
        finally:
            self._release(connection, reusable)
        return reply

    def _origin(self, url: str) -> _Origin:
        origin = self._origins.get(url)
        if origin is None:
            origin = _origin_of(url)
            if len(self._origins) >= _ORIGIN_CACHE:
                self._origins.clear()
            self._origins[url] = origin
        return origin

    async def _acquire(self, origin: _Origin, deadline: float) -> _Connection:
        """A connection to ``origin``, from its pool or new (connected by ``deadline``,
        the loop's clock)."""
        if self._closed:
            raise ConnectFailed("the client is closed")
        idle = self._idle.get(origin.key)
        now = time.monotonic()
        while idle:
            connection, _ = idle.popitem()
            transport = connection.transport
            stale = now - connection.idle_since > self._keepalive_s
            if connection.closed or stale or transport is None or transport.is_closing():
                connection.abort()
                continue
            self._busy.add(connection)
            return connection
        loop = asyncio.get_running_loop()
        context = self._tls_context() if origin.tls else None
        try:
            async with asyncio.timeout_at(deadline):
                _, protocol = await loop.create_connection(
                    lambda: _Connection(self, origin.key),
                    origin.host,
                    origin.port,
                    ssl=context,
                    server_hostname=origin.host if context is not None else None,
                )
        except TimeoutError:
            raise  # a subclass of OSError: the deadline, not a refusal
        # Refused, unreachable, DNS (gaierror), TLS (SSLError); UnicodeError for a host
        # name IDNA cannot encode.
        except (OSError, UnicodeError) as exc:
            raise ConnectFailed(f"{exc.__class__.__name__}: {exc}") from exc
        self._busy.add(protocol)
        return protocol

    def _tls_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def _release(self, connection: _Connection, reusable: bool) -> None:
        self._busy.discard(connection)
        if not reusable or self._closed or connection.closed:
            connection.abort()
            return
        idle = self._idle.setdefault(connection.origin_key, {})
        if len(idle) >= MAX_IDLE_PER_ORIGIN:
            connection.abort()
            return
        connection.idle_since = time.monotonic()
        idle[connection] = None

    def forget(self, connection: _Connection) -> None:
        """A connection ended: it leaves the idle pool."""
        idle = self._idle.get(connection.origin_key)
        if idle is not None:
            idle.pop(connection, None)

    def idle_connections(self) -> int:
        """Connections waiting in the pools (for tests and metrics)."""
        return sum(len(idle) for idle in self._idle.values())

    async def __aenter__(self) -> Http1Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every connection; later calls fail with :class:`ConnectFailed`."""
        self._closed = True
        for idle in self._idle.values():
            for connection in list(idle):
                connection.abort()
            idle.clear()
        for connection in list(self._busy):
            connection.abort(ServerDisconnected("the client was closed"))
        self._busy.clear()
        await asyncio.sleep(0)  # let the transports run their connection_lost
