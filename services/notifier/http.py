"""POSTing a webhook safely: vet every address the URL resolves to, connect only to
those vetted addresses (no DNS rebinding between check and connect), follow no
redirect, bounded by one total timeout."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from notifier.handlers import Post, PostResult
from relay.netguard import IPNetwork, refusal_reason


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
    url: URL, allow: Sequence[IPNetwork], timeout_s: float
) -> list[ResolveResult]:
    """Resolve ``url``'s host and refuse if any address is forbidden."""
    host = url.host
    if not host or url.scheme not in ("http", "https"):
        raise Refused(f"not an http(s) URL: {url}")
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        literal = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        literal = None
    if literal is not None:
        infos = [(socket.AF_INET6 if literal.version == 6 else socket.AF_INET, str(literal))]
    else:
        loop = asyncio.get_running_loop()
        try:
            found = await asyncio.wait_for(
                loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout_s
            )
        except (OSError, TimeoutError) as exc:
            raise Refused(f"cannot resolve {host}: {exc}") from None
        infos = [(family, str(sockaddr[0])) for family, _, _, _, sockaddr in found]
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


def guarded_poster(allow: Sequence[IPNetwork], timeout_s: float) -> Post:
    """A :data:`Post` that applies the SSRF guard, then POSTs with a total timeout."""

    async def post(url: str, body: bytes, headers: dict[str, str]) -> PostResult:
        try:
            parsed = URL(url)
            addresses = await vetted_addresses(parsed, allow, timeout_s)
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
                    parsed,
                    data=body,
                    headers=request_headers,
                    timeout=aiohttp.ClientTimeout(total=timeout_s),
                    allow_redirects=False,
                ) as response,
            ):
                await response.read()
                return PostResult(response.status)
        except TimeoutError:
            return PostResult(None, f"timed out after {timeout_s:g}s")
        except aiohttp.ClientError as exc:
            return PostResult(None, f"{exc.__class__.__name__}: {exc}")

    return post
