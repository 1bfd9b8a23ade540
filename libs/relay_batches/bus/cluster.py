"""A robust broker connection over the nodes of a RabbitMQ cluster.

``RELAY_AMQP_URL`` may list several addresses, comma-separated (one per node:
``amqp://u:p@rabbit-1:5672/,amqp://u:p@rabbit-2:5672/``). aio-pika's robust connection
reconnects to the one URL it was given, which does not help when that node is gone.
:class:`ClusterConnection` keeps aio-pika's recovery (channels, queues, bindings and
consumers restored on every reconnect) and chooses where each attempt goes: when the
connection drops, and after each failed attempt, it moves to the next address, round the
list, until one node answers (the first two rounds quickly, then an interval apart).
:func:`connect_cluster` makes the first connection, trying each address in turn from a
random one, so a service's replicas spread over the nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Sequence
from typing import Any

from aio_pika import RobustConnection
from aio_pika.exceptions import CONNECTION_EXCEPTIONS
from yarl import URL

from relay_batches.settings.kinds import mask_url

log = logging.getLogger("relay.bus")


# After a node is lost the other nodes take a moment to drop what its connections held
# (a service's exclusive queues: restoring one meanwhile is RESOURCE_LOCKED), so the
# first rounds over the addresses go quickly, then attempts come an interval apart.
QUICK_RETRY_S = 0.25
QUICK_ROUNDS = 2


def broker_addresses(amqp_url: str) -> list[str]:
    """The addresses of ``RELAY_AMQP_URL``: one URL, or several separated by commas."""
    return [part.strip() for part in amqp_url.split(",") if part.strip()]


class ClusterConnection(RobustConnection):
    """A robust connection that moves round ``addresses`` (module doc); ``start`` is the
    index of the first address it tries."""

    def __init__(self, addresses: Sequence[str], start: int = 0, **kwargs: Any) -> None:
        if not addresses:
            raise ValueError("no broker address")
        self._addresses = [URL(address) for address in addresses]
        self._at = start % len(self._addresses)
        super().__init__(self._addresses[self._at], **kwargs)
        self._interval = float(self.reconnect_interval)
        self._failed = 0  # attempts since the connection was last up

    async def _on_connection_close(self, closing: asyncio.Future[Any]) -> None:
        # Called when the connection drops and when an attempt fails (refused, or its
        # channels could not be restored): the next attempt goes to the next address.
        if not (self._close_called or self.is_closed) and len(self._addresses) > 1:
            self._at = (self._at + 1) % len(self._addresses)
            self.url = self._addresses[self._at]
            self._failed += 1
            quick = self._failed <= QUICK_ROUNDS * len(self._addresses)
            self.reconnect_interval = QUICK_RETRY_S if quick else self._interval
            log.info("broker_address_next", extra={"address": mask_url(str(self.url))})
        await super()._on_connection_close(closing)

    async def _on_connected(self) -> None:
        await super()._on_connected()
        self._failed = 0
        self.reconnect_interval = self._interval


async def connect_cluster(
    amqp_url: str, *, timeout: float, reconnect_interval: float, **kwargs: Any
) -> ClusterConnection:
    """Connect to an address of ``amqp_url`` that answers, trying each in turn from a
    random one; the last failure if none does."""
    addresses = broker_addresses(amqp_url)
    first = random.randrange(len(addresses))
    failure: BaseException | None = None
    for start in range(first, first + len(addresses)):
        connection = ClusterConnection(
            addresses, start, reconnect_interval=reconnect_interval, **kwargs
        )
        try:
            await connection.connect(timeout=timeout)
        except (*CONNECTION_EXCEPTIONS, TimeoutError) as exc:
            failure = exc
            with contextlib.suppress(*CONNECTION_EXCEPTIONS):
                await connection.close()
            continue
        return connection
    assert failure is not None
    raise failure
