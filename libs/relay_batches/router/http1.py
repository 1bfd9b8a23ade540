"""The upstream calls' HTTP/1.1 client: keep-alive connections pooled per workspace and
origin, one request at a time on each, every reply parsed by ``httptools`` (llhttp, see
:mod:`relay_batches.router.http_reply`) and read into memory up to a cap.

Why not aiohttp's client here: the row-worker's CPU per row is mostly its upstream call.
Measured side by side (one uvloop process, 32 calls in flight against the simulator, JSON
encoding and decoding included), a call through this client costs about half of one
through ``aiohttp.ClientSession`` even tuned (one session, DNS cache, no cookie jar,
prebuilt URLs), and aiohttp's pool is keyed by origin alone. The router needs little of
a general client: a POST of a bytes body, the status, one header (``Retry-After``) and a
bounded body. Everything else (the offloader's provider clients, webhooks) stays on
aiohttp.

What it does: ``http`` and ``https`` (the default SSL context: certificates and host name
checked, SNI); a request handed to the transport whole (its body is in memory already)
and never sent a second time (the router retries, with its backoff, limiter and attempt
count); replies framed by ``Content-Length``, by the chunked transfer coding or by the end
of the connection (RFC 9112, section 6.3); interim ``1xx`` replies skipped; ``gzip`` and
``deflate`` content codings inflated up to the cap (none is asked for: no
``Accept-Encoding`` is sent, so a server should not use one); the whole call, connecting
included, within one total timeout. What it does not do: proxies, redirects, cookies,
HTTP/2.

Tenants apart on the wire: each call names its workspace, and connections are pooled per
(workspace, origin), so whatever an upstream sends late (a reply nobody asked for, read
as the answer to the next request on that connection) stays within the workspace whose
call it came from. A connection goes back to its pool only after a reply read exactly to
its end with keep-alive; bytes arriving on an idle connection close it; one idle longer
than ``keepalive_s`` is never reused and is closed soon after. A pool lives only while it
holds a connection, and idle connections are at most ``max_idle`` in all (the oldest is
closed first), so the pools stay bounded however many workspaces a worker serves.

Within a workspace, a reply held back and sent once the next request is on the wire
cannot be told from that request's answer (HTTP/1.1 has no request ids): any client that
reuses connections reads it so. What bounds that here: an upstream caught sending bytes
nobody asked for (a second reply after one, or bytes on an idle connection) gets no reuse
from that workspace for :data:`DISTRUST_S`, so the replies it can misplace are about the
calls in flight when it was caught, not a share of every call after.

Failures are :class:`UpstreamConnectionError` (``ConnectFailed``, ``ServerDisconnected``,
``BadReply``) or ``TimeoutError``; a call that fails, times out or is cancelled aborts its
connection, so a late reply can never be read as the answer to the next request. A
connection reset before the reply is complete is a ``ServerDisconnected`` whatever the
framing (a body framed by the connection's end is complete only at a clean close).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

from relay_batches.router.http_reply import (
    BadReply,
    ConnectFailed,
    HttpReply,
    ReplyReader,
    ServerDisconnected,
    UpstreamConnectionError,
    encode_head,
)

__all__ = [
    "BadReply",
    "ConnectFailed",
    "Http1Client",
    "HttpReply",
    "ServerDisconnected",
    "UpstreamConnectionError",
]

# An idle connection older than this is closed, not reused: below uvicorn's 5 s (vLLM),
# so a server closing an idle connection seldom races a request sent on it (such a
# request fails as ServerDisconnected, and the router retries it).
KEEPALIVE_S = 4.0
MAX_IDLE = 512  # idle connections of every pool together
# An upstream caught sending bytes nobody asked for (on an idle connection, or after a
# reply) gets no connection reuse from that workspace for this long: each call then has
# a connection of its own, so a reply it holds back has no next request to answer.
DISTRUST_S = 30.0
MAX_DISTRUSTED = 1024  # (workspace, origin) pairs remembered
_ORIGIN_CACHE = 256  # parsed URLs kept (the routes hold a few)

OriginKey = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class _Origin:
    """Where a URL's requests go, and the parts of its request line and head."""

    key: OriginKey
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


class _Pool:
    """The connections of one (workspace, origin): idle ones, and a count of busy ones."""

    __slots__ = ("busy", "idle", "key")

    def __init__(self, key: tuple[str, OriginKey]) -> None:
        self.key = key
        self.idle: dict[_Connection, None] = {}
        self.busy = 0


class _Connection(asyncio.Protocol):
    """One keep-alive connection: at most one request in flight."""

    def __init__(self, client: Http1Client, pool: _Pool) -> None:
        self._client = client
        self.pool = pool
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
            self._client.distrust(self.pool.key)
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
            if exc is not None:  # a reset: whatever was read is not known to be whole
                raise ServerDisconnected("connection lost before the reply was complete")
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
        if reader.unasked:
            self._client.distrust(self.pool.key)
        return reader.reply, reader.reusable and not self.closed and not unsent


class Http1Client:
    """POSTs over HTTP/1.1 connections pooled per workspace and origin (see the module's
    docstring)."""

    def __init__(
        self,
        keepalive_s: float = KEEPALIVE_S,
        ssl_context: ssl.SSLContext | None = None,
        max_idle: int = MAX_IDLE,
    ) -> None:
        self._keepalive_s = keepalive_s
        self._ssl = ssl_context
        self._max_idle = max_idle
        self._origins: dict[str, _Origin] = {}
        self._pools: dict[tuple[str, OriginKey], _Pool] = {}
        self._idle: dict[_Connection, None] = {}  # every pool's, oldest first
        self._busy: set[_Connection] = set()
        self._sweep: asyncio.TimerHandle | None = None
        self._distrusted: dict[tuple[str, OriginKey], float] = {}  # until (loop clock)
        self._closed = False

    async def post(
        self,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        timeout_s: float,
        limit: int,
        workspace: str = "",
    ) -> HttpReply:
        """POST ``body`` to ``url`` over a connection of ``workspace``'s own; the reply,
        its body read up to ``limit`` bytes (then ``limit + 1``). Raises
        :class:`UpstreamConnectionError` or ``TimeoutError`` (the whole call, connecting
        included, past ``timeout_s``)."""
        origin = self._origin(url)
        head = encode_head(origin.target, origin.host_header, headers, len(body))
        # One deadline for the whole call (a timer per exchange, not asyncio.timeout's
        # task bookkeeping: this is the row-worker's hot path).
        deadline = asyncio.get_running_loop().time() + timeout_s
        # Never sent again here, whatever failed (a POST may have been taken up): the
        # router retries with its backoff, its limiter and its attempt count.
        connection = await self._acquire(workspace, origin, deadline)
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

    async def _acquire(self, workspace: str, origin: _Origin, deadline: float) -> _Connection:
        """A connection of ``workspace`` to ``origin``, from their pool or new (connected
        by ``deadline``, the loop's clock)."""
        if self._closed:
            raise ConnectFailed("the client is closed")
        key = (workspace, origin.key)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool(key)
        loop = asyncio.get_running_loop()
        idle = pool.idle
        if idle:
            now = loop.time()
            while idle:
                connection, _ = idle.popitem()  # the most recent: the least likely stale
                del self._idle[connection]
                transport = connection.transport
                stale = now - connection.idle_since > self._keepalive_s
                if connection.closed or stale or transport is None or transport.is_closing():
                    connection.abort()
                    continue
                pool.busy += 1
                self._busy.add(connection)
                return connection
        pool.busy += 1  # held while connecting: the pool is not dropped meanwhile
        context = self._tls_context() if origin.tls else None
        try:
            async with asyncio.timeout_at(deadline):
                _, protocol = await loop.create_connection(
                    lambda: _Connection(self, pool),
                    origin.host,
                    origin.port,
                    ssl=context,
                    server_hostname=origin.host if context is not None else None,
                )
        except BaseException as exc:
            pool.busy -= 1
            self._drop_if_empty(pool)
            if isinstance(exc, TimeoutError):
                raise  # a subclass of OSError: the deadline, not a refusal
            # Refused, unreachable, DNS (gaierror), TLS (SSLError); UnicodeError for a
            # host name IDNA cannot encode.
            if isinstance(exc, (OSError, UnicodeError)):
                raise ConnectFailed(f"{exc.__class__.__name__}: {exc}") from exc
            raise
        self._busy.add(protocol)
        return protocol

    def _tls_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl

    def _release(self, connection: _Connection, reusable: bool) -> None:
        self._busy.discard(connection)
        pool = connection.pool
        pool.busy -= 1
        if reusable and self._distrusted and self._distrusts(pool.key):
            reusable = False
        if not reusable or self._closed or connection.closed:
            connection.abort()
            self._drop_if_empty(pool)
            return
        loop = asyncio.get_running_loop()
        connection.idle_since = loop.time()
        pool.idle[connection] = None
        self._idle[connection] = None
        if len(self._idle) > self._max_idle:
            self._close_idle(next(iter(self._idle)))
        if self._sweep is None:
            self._sweep = loop.call_later(self._keepalive_s, self._close_stale)

    def distrust(self, key: tuple[str, OriginKey]) -> None:
        """The upstream of pool ``key`` sent bytes nobody asked for: its idle connections
        are closed and, for :data:`DISTRUST_S`, none is reused."""
        self._distrusted.pop(key, None)
        self._distrusted[key] = asyncio.get_running_loop().time() + DISTRUST_S
        if len(self._distrusted) > MAX_DISTRUSTED:
            del self._distrusted[next(iter(self._distrusted))]
        pool = self._pools.get(key)
        if pool is not None:
            for connection in list(pool.idle):
                self._close_idle(connection)

    def _distrusts(self, key: tuple[str, OriginKey]) -> bool:
        until = self._distrusted.get(key)
        if until is None:
            return False
        if asyncio.get_running_loop().time() < until:
            return True
        del self._distrusted[key]
        return False

    def _close_idle(self, connection: _Connection) -> None:
        """Close an idle connection and drop its pool if that was its last."""
        self._idle.pop(connection, None)
        connection.pool.idle.pop(connection, None)
        connection.abort()
        self._drop_if_empty(connection.pool)

    def _close_stale(self) -> None:
        """Close the connections idle for ``keepalive_s`` or more (oldest first), and come
        back when the next one will be."""
        self._sweep = None
        now = asyncio.get_running_loop().time()
        while self._idle:
            oldest = next(iter(self._idle))
            wait = oldest.idle_since + self._keepalive_s - now
            if wait > 0:
                self._sweep = asyncio.get_running_loop().call_later(wait, self._close_stale)
                return
            self._close_idle(oldest)

    def _drop_if_empty(self, pool: _Pool) -> None:
        if not pool.busy and not pool.idle and self._pools.get(pool.key) is pool:
            del self._pools[pool.key]

    def forget(self, connection: _Connection) -> None:
        """A connection ended: it leaves the idle pool."""
        pool = connection.pool
        if connection in pool.idle:
            del pool.idle[connection]
            self._idle.pop(connection, None)
            self._drop_if_empty(pool)

    def idle_connections(self) -> int:
        """Connections waiting in the pools (for tests and metrics)."""
        return len(self._idle)

    def pools(self) -> int:
        """Pools holding a connection, busy or idle (for tests and metrics)."""
        return len(self._pools)

    async def __aenter__(self) -> Http1Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every connection; later calls fail with :class:`ConnectFailed`."""
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for connection in list(self._idle):
            self._close_idle(connection)
        for connection in list(self._busy):
            connection.abort(ServerDisconnected("the client was closed"))
        self._busy.clear()
        await asyncio.sleep(0)  # let the transports run their connection_lost
