"""POSTing a webhook safely: vet every address the URL resolves to, connect only to
those vetted addresses (no DNS rebinding between check and connect), follow no
redirect, read at most ``MAX_REPLY_BYTES`` of the reply, and bound the whole of it — DNS
included — by one total deadline."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from relay_batches.netguard import IPNetwork, refusal_reason
from relay_batches.services.notifier.core import Post, PostResult

MAX_REPLY_BYTES = 64 * 1024  # of the receiver's reply body; the rest is never read

# getaddrinfo(host, port) -> [(family, address)]: the loop's resolver, or a test's.
Lookup = Callable[[str, int], Awaitable[list[tuple[int, str]]]]


async def system_lookup(host: str, port: int) -> list[tuple[int, str]]:
    """The host's addresses from the system resolver (``getaddrinfo``)."""
    found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [(family, str(sockaddr[0])) for family, _, _, _, sockaddr in found]


class Refused(Exception):
    """The webhook URL points somewhere Relay must not connect to."""


class PinnedResolver(AbstractResolver):
    """Answers with addresses resolved and vetted beforehand, and nothing else."""

    def __init__(self, results: list[ResolveResult]) -> None:
        self._results = results

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """The vetted addresses (whatever host is asked for: the session serves one URL)."""
        return [{**r, "hostname": host, "port": port} for r in self._results]

    async def close(self) -> None:
        """Nothing to release."""


async def vetted_addresses(
    url: URL, allow: Sequence[IPNetwork], lookup: Lookup = system_lookup
) -> list[ResolveResult]:
    """Resolve ``url``'s host and refuse if any address is forbidden.

    No timeout of its own: the caller's deadline covers resolving and posting together.
    """
    host = url.host
    if not host or url.scheme not in ("http", "https"):
        raise Refused(f"not an http(s) URL: {url}")
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        literal = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        literal = None
    infos: list[tuple[int, str]]
    if literal is not None:
        infos = [(socket.AF_INET6 if literal.version == 6 else socket.AF_INET, str(literal))]
    else:
        try:
            infos = await lookup(host, port)
        except OSError as exc:
            raise Refused(f"cannot resolve {host}: {exc}") from None
    results: list[ResolveResult] = []
    for family, address in dict.fromkeys(infos):
        reason = refusal_reason(address.split("%")[0], allow)
        if reason is not None:
            raise Refused(f"{host} resolves to {reason}")
        results.append(
            {
                "hostname": host,
                "host": address,
                "port": port,
                "family": family,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
        )
    if not results:
        raise Refused(f"{host} resolves to no address")
    return results


def guarded_poster(
    allow: Sequence[IPNetwork], timeout_s: float, lookup: Lookup = system_lookup
) -> Post:
    """A :data:`Post` that applies the SSRF guard, then POSTs; resolving the host and the
    whole request share one deadline of ``timeout_s`` (the webhook timeout of
    docs/guides/webhooks.md)."""

    async def post(url: str, body: bytes, headers: dict[str, str]) -> PostResult:
        try:
            async with asyncio.timeout(timeout_s):
                return await _vet_and_post(url, body, headers, allow, lookup)
        except TimeoutError:
            return PostResult(None, f"timed out after {timeout_s:g}s")

    return post


async def _vet_and_post(
    url: str, body: bytes, headers: dict[str, str], allow: Sequence[IPNetwork], lookup: Lookup
) -> PostResult:
    try:
        parsed = URL(url)
        addresses = await vetted_addresses(parsed, allow, lookup)
    except (Refused, ValueError) as exc:
        return PostResult(None, f"refused: {exc}", refused=True)
    connector = aiohttp.TCPConnector(resolver=PinnedResolver(addresses), force_close=True)
    request_headers: dict[str, Any] = {
        "Content-Type": "application/json",
        "User-Agent": "relay-batches",
        **headers,
    }
    try:
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.post(
                parsed, data=body, headers=request_headers, allow_redirects=False
            ) as response,
        ):
            await _read_capped(response.content, MAX_REPLY_BYTES)
            return PostResult(response.status)
    except aiohttp.ClientError as exc:
        return PostResult(None, f"{exc.__class__.__name__}: {exc}")


async def _read_capped(content: aiohttp.StreamReader, limit: int) -> int:
    """Read (and drop) at most ``limit`` bytes of a reply body; return how many.

    Receivers usually answer with a few bytes; one that streams an endless or huge body
    neither grows our memory nor holds the delivery open (the connection is closed
    with the rest unread).
    """
    taken = 0
    while taken < limit:
        chunk = await content.read(limit - taken)
        if not chunk:
            break
        taken += len(chunk)
    return taken
