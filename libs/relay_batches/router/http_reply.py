"""One upstream reply read off the wire: the bytes are parsed by ``httptools`` (llhttp,
the parser under uvicorn and Node.js), and this module adds what the router relies on
around it: the 8 MiB cap (``gzip`` and ``deflate`` inflated within it), bounds on a head,
on a reply's framing overhead and on interim replies, and whether the connection may
carry another request. No I/O here: tests feed it bytes.

What llhttp refuses is a :class:`BadReply`: a malformed status line or header, a bare CR
or LF inside a header, a bad or repeated ``Content-Length``, a bad chunk. What it accepts
that this client does not: a status below 100, a ``101`` (no upgrade was asked for), a
transfer coding other than ``chunked`` (none was offered), an HTTP version other than
1.0 and 1.1. A reply framed both by ``Content-Length`` and as chunked is read as chunked
(RFC 9112, 6.3) and its connection is never reused.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import httptools

MAX_HEAD_BYTES = 64 * 1024  # a reply's status line and headers together
MAX_INTERIM_REPLIES = 16  # 1xx replies before the final one
# Chunk overhead bounded: past the first FREE_CHUNKS chunks a reply's chunks must carry
# MIN_CHUNK_BYTES of body each on average (a million 1-byte chunks fail after ~4,200).
FREE_CHUNKS = 4096
MIN_CHUNK_BYTES = 64
# Framing, trailers and chunk extensions together: a reply's bytes on the wire are at most
# twice the cap plus this (every byte received is parsed; this bounds the work and memory).
MAX_OVERHEAD_BYTES = 2 * MAX_HEAD_BYTES
USER_AGENT = "relay-batches"
_VERSIONS = ("1.1", "1.0")


class UpstreamConnectionError(Exception):
    """The call failed on the connection: nothing or only part of a reply was read."""


class ConnectFailed(UpstreamConnectionError):
    """No connection: refused, unreachable, a name that does not resolve, TLS refused."""


class ServerDisconnected(UpstreamConnectionError):
    """The server closed the connection before the reply was complete."""


class BadReply(UpstreamConnectionError):
    """What the server sent is not an HTTP/1.x reply this client can frame."""


class _Stop(Exception):
    """Raised inside a parser callback to stop parsing: the reply is complete."""


@dataclass(frozen=True, slots=True)
class HttpReply:
    """A reply: status, headers (names lower-cased; a repeated one's values joined with
    ", ", as one list) and body (inflated; ``limit + 1`` bytes when it was longer than the
    call's limit)."""

    status: int
    headers: dict[str, str]
    body: bytes


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
    """Frames one reply from the bytes a connection receives.

    ``feed`` returns True once the reply is complete; :attr:`reply` then holds it and
    :attr:`reusable` says whether the connection may carry another request (the reply was
    framed by length or chunks, the server did not ask to close, and no other reply began
    after it); :attr:`unasked` that bytes came after the reply. ``eof`` is the
    connection's clean end: True if that completes the reply (framing by the connection's
    end), else it raises :class:`ServerDisconnected`. Malformed input raises
    :class:`BadReply`.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._max_wire = 2 * limit + MAX_OVERHEAD_BYTES
        self._parser = httptools.HttpResponseParser(self)
        # Both framings sent: read as chunked (RFC 9112, 6.3), never reused (see below).
        self._parser.set_dangerous_leniencies(lenient_chunked_length=True)
        self._wire = 0  # bytes fed
        self._head = 0  # bytes of the current head's fields
        self._in_head = True
        self._interim = 0
        self._final = False
        self._status = 0
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._size = 0
        self._chunks = 0
        self._over = False
        self._until_eof = False
        self._keep_alive = False
        self.reply: HttpReply | None = None
        self.reusable = False
        self.unasked = False  # bytes came after the reply: the upstream is not trusted

    def feed(self, data: bytes) -> bool:
        """Take the next bytes received; True once the reply is complete."""
        if self.reply is not None:
            self.reusable, self.unasked = False, True  # bytes nobody asked for
            return True
        self._wire += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, BadReply):
                raise cause from None
            if not isinstance(cause, _Stop):
                raise BadReply(f"reply could not be read: {cause!r}") from exc
        except httptools.HttpParserError as exc:
            if not self._complete():
                raise BadReply(f"malformed reply: {exc}") from None
            self.reusable, self.unasked = False, True  # bytes after the reply
        if self._complete():  # the parser's callbacks set the reply
            return True
        if self._in_head and self._wire > MAX_HEAD_BYTES * (self._interim + 1):
            raise BadReply(f"reply head longer than {MAX_HEAD_BYTES} bytes")
        if self._wire > self._max_wire:
            raise BadReply(f"reply longer than {self._max_wire} bytes on the wire")
        return False

    def _complete(self) -> bool:
        return self.reply is not None

    def eof(self) -> bool:
        """The connection ended cleanly: True if that completes the reply."""
        if self.reply is not None:
            return True
        if self._until_eof:
            self._finish()
            return True
        raise ServerDisconnected("connection closed before the reply was complete")

    # --- llhttp's callbacks (httptools calls them by name) --------------------------------

    def on_message_begin(self) -> None:
        """A message starts: after the reply, that is bytes nobody asked for."""
        if self.reply is not None:
            self.reusable, self.unasked = False, True
            raise _Stop

    def on_header(self, name: bytes, value: bytes) -> None:
        """A header field (trailer fields after the body are not kept)."""
        if not self._in_head:
            return
        self._head += len(name) + len(value) + 4
        if self._head > MAX_HEAD_BYTES:
            raise BadReply(f"reply head longer than {MAX_HEAD_BYTES} bytes")
        key = name.decode("latin-1").lower()
        text = value.strip(b" \t").decode("latin-1")
        # A repeated field is one list (RFC 9110, 5.3).
        headers = self._headers
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def on_headers_complete(self) -> None:
        """The head is read: status, framing and keep-alive are known."""
        parser = self._parser
        status = parser.get_status_code()
        if status < 100:
            raise BadReply(f"bad status code {status}")
        if parser.get_http_version() not in _VERSIONS:
            raise BadReply(f"not an HTTP/1.x reply: {parser.get_http_version()}")
        if status < 200:
            if status == 101:
                raise BadReply("the server switched protocols")
            self._interim += 1
            if self._interim > MAX_INTERIM_REPLIES:
                raise BadReply(f"more than {MAX_INTERIM_REPLIES} interim replies")
            self._headers, self._head = {}, 0
            return  # an interim reply: the final one follows
        headers = self._headers
        coding = headers.get("transfer-encoding")
        # No TE is sent, so chunked is the only transfer coding a server may use.
        if coding is not None and coding.strip().lower() != "chunked":
            raise BadReply(f"unsupported Transfer-Encoding {coding[:40]!r}")
        length = headers.get("content-length")
        self._status, self._final, self._in_head = status, True, False
        # Both framings sent: never trust what follows on this connection.
        self._keep_alive = parser.should_keep_alive() and (coding is None or length is None)
        # Neither: the connection's end frames the body (never reused).
        self._until_eof = coding is None and length is None and status not in (204, 304)

    def on_body(self, data: bytes) -> None:
        """A piece of the body: kept up to ``limit + 1`` bytes, then the reply ends."""
        room = self._limit + 1 - self._size
        if len(data) >= room:
            data, self._over = data[:room], True
        self._body.append(data)
        self._size += len(data)
        if self._over:
            self._finish()
            raise _Stop

    def on_chunk_header(self) -> None:
        """A chunk starts: the chunk overhead stays bounded (see :data:`FREE_CHUNKS`)."""
        self._chunks += 1
        if self._chunks > FREE_CHUNKS + self._size // MIN_CHUNK_BYTES:
            raise BadReply(f"{self._chunks} chunks for {self._size} bytes of body")

    def on_message_complete(self) -> None:
        """A message ends: an interim one is skipped, a final one is the reply."""
        if self._final:
            self._finish()

    def _finish(self) -> None:
        body = b"".join(self._body)
        self._body = []
        coding = self._headers.get("content-encoding", "").strip().lower()
        # A body cut at the cap stays coded: limit + 1 bytes say it was too long.
        if coding in ("gzip", "x-gzip", "deflate") and body and not self._over:
            body = _inflate(body, coding, self._limit)
        self.reply = HttpReply(self._status, self._headers, body)
        self.reusable = self._keep_alive and not self._over


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
