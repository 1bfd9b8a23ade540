"""Local TCP ports for ``relay dev``: which are free, and a health port that follows suit.

``make run`` gives every service its own health port. A port chosen by ``relay dev`` may be
taken by someone else between two starts of a child; a :class:`HealthPort` that was not
fixed by the user then moves to another free port instead of crash-looping on a taken one.
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _bound(host: str, port: int) -> socket.socket:
    """A socket bound to ``(host, port)`` the way an asyncio server binds (address reuse
    on, so a port in TIME_WAIT counts as free); ``OSError`` when the port is taken."""
    sock = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen()
    except OSError:
        sock.close()
        raise
    return sock


def is_free(host: str, port: int) -> bool:
    """True when a server could listen on ``(host, port)`` right now."""
    try:
        _bound(host, port).close()
    except OSError:
        return False
    return True


def free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct ports that are free on ``host`` right now."""
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(_bound(host, 0)) for _ in range(count)]
        return [int(sock.getsockname()[1]) for sock in socks]


def url_host(host: str) -> str:
    """``host`` as it goes into a URL a local client can use (a wildcard address becomes
    loopback; an IPv6 address gets brackets)."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


@dataclass
class HealthPort:
    """The health port of one child: ``fixed`` when the user chose it, else movable."""

    host: str
    port: int
    fixed: bool = False

    def claim(self) -> tuple[int, bool]:
        """The port to start the child on, and whether it moved since the last start."""
        if self.fixed or is_free(self.host, self.port):
            return self.port, False
        (self.port,) = free_ports(self.host, 1)
        return self.port, True

    @property
    def url(self) -> str:
        """Where the child answers ``/readyz``."""
        return f"http://{url_host(self.host)}:{self.port}/readyz"
