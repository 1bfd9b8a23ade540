"""SSRF guard for outbound webhooks: which addresses Relay refuses to connect to.

By default a webhook may only reach globally routable unicast addresses. Loopback,
private (RFC 1918, ULA), carrier-grade NAT, link-local (including the cloud metadata
address), multicast, unspecified and reserved ranges are refused, as are IPv4 addresses
hidden inside IPv6 (``::ffff:127.0.0.1``, 6to4, NAT64). An allow-list of networks opens
specific ranges (development, tests, an internal receiver).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

METADATA_ADDRESSES = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


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
