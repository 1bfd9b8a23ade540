"""SSRF guard for outbound webhooks: which addresses Relay refuses to connect to.

By default a webhook may only reach globally routable unicast addresses. Loopback,
private (RFC 1918, ULA), carrier-grade NAT, link-local (including the cloud metadata
address), multicast, unspecified and reserved ranges are refused, as are IPv4 addresses
hidden inside IPv6 (``::ffff:127.0.0.1``, 6to4, NAT64). An allow-list of networks opens
specific ranges (development, tests, an internal receiver).

:func:`vetted_infos` applies it to a URL: every address its host resolves to must pass.
The notifier connects only to those addresses; the API refuses a webhook endpoint whose
URL fails it when it is created.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from yarl import URL

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

METADATA_ADDRESSES = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

# getaddrinfo(host, port) -> [(family, address)]: the loop's resolver, or a test's.
Lookup = Callable[[str, int], Awaitable[list[tuple[int, str]]]]


class Refused(Exception):
    """The webhook URL points somewhere Relay must not connect to."""


async def system_lookup(host: str, port: int) -> list[tuple[int, str]]:
    """The host's addresses from the system resolver (``getaddrinfo``)."""
    found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [(family, str(sockaddr[0])) for family, _, _, _, sockaddr in found]


async def vetted_infos(
    url: URL, allow: Sequence[IPNetwork], lookup: Lookup = system_lookup
) -> tuple[str, int, list[tuple[int, str]]]:
    """``url``'s host, port and the ``(family, address)`` pairs it resolves to, every one
    allowed; :class:`Refused` naming why otherwise (not http(s), unresolvable, or an
    address the guard refuses). No timeout of its own: the caller bounds it."""
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
    vetted = list(dict.fromkeys(infos))
    for _, address in vetted:
        reason = refusal_reason(address.split("%")[0], allow)
        if reason is not None:
            raise Refused(f"{host} resolves to {reason}")
    if not vetted:
        raise Refused(f"{host} resolves to no address")
    return host, port, vetted


def parse_networks(text: str) -> tuple[IPNetwork, ...]:
    """Comma-separated CIDRs (or bare addresses) → networks; ValueError on a bad one."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    return tuple(ipaddress.ip_network(p, strict=False) for p in parts)


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def refusal_reason(address: str | IPAddress, allow: Sequence[IPNetwork] = ()) -> str | None:
    """Why a webhook must not connect to ``address``, or None if it may."""
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if any(ip.version == net.version and ip in net for net in allow):
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_ipv4(ip)
        if inner is not None:
            reason = refusal_reason(inner, allow)
            return None if reason is None else f"{reason} (inside IPv6 {ip})"
    if ip in METADATA_ADDRESSES:
        return f"{ip} is a cloud metadata address"
    checks = (
        (ip.is_unspecified, "unspecified"),
        (ip.is_loopback, "loopback"),
        (ip.is_link_local, "link-local"),
        (ip.is_multicast, "multicast"),
        (ip.is_reserved, "reserved"),
        (ip.is_private, "private"),
        (not ip.is_global, "not globally routable"),
    )
    for refused, label in checks:
        if refused:
            return f"{ip} is {label}"
    return None


@dataclass(frozen=True)
class UrlGuard:
    """The guard as the API applies it to a webhook endpoint's URL when it is created:
    the allow-list, a deadline for resolving its host, and the resolver."""

    allow: tuple[IPNetwork, ...] = ()
    timeout_s: float = 10.0
    lookup: Lookup = system_lookup

    async def refusal(self, url: str) -> str | None:
        """Why a webhook must not be sent to ``url`` now, or None if it may."""
        try:
            async with asyncio.timeout(self.timeout_s):
                await vetted_infos(URL(url), self.allow, self.lookup)
        except Refused as exc:
            return str(exc)
        except ValueError as exc:
            return f"not a valid URL: {exc}"
        except TimeoutError:
            return f"resolving its host took longer than {self.timeout_s:g}s"
        return None
