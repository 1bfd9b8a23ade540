"""POSTing a webhook safely: vet every address the URL resolves to, connect only to
those vetted addresses (no DNS rebinding between check and connect), follow no
redirect, read at most ``MAX_REPLY_BYTES`` of the reply, and bound the whole of it — DNS
included — by one total deadline."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from relay_batches.netguard import IPNetwork, Lookup, Refused, system_lookup, vetted_infos
from relay_batches.services.notifier.core import Post, PostResult

MAX_REPLY_BYTES = 64 * 1024  # of the receiver's reply body; the rest is never read


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
    """Resolve ``url``'s host and refuse if any address is forbidden
    (:func:`~relay_batches.netguard.vetted_infos`).

    No timeout of its own: the caller's deadline covers resolving and posting together.
    """
    host, port, infos = await vetted_infos(url, allow, lookup)
    return [
        {
            "hostname": host,
            "host": address,
            "port": port,
            "family": family,
            "proto": 0,
            "flags": socket.AI_NUMERICHOST,
        }
        for family, address in infos
    ]


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
