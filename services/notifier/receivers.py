"""Receiver isolation: at most a few POSTs in flight per receiver, so a hanging one only
delays its own deliveries.

A receiver is a workspace's URL authority (``host:port``): one workspace's slow endpoint
never takes the slots of another workspace, even on the same host. A delivery beyond
a receiver's slots waits for one, but neither long nor in numbers: it waits at most
``wait_s``, and at most ``waiters`` wait per receiver; past either bound it is refused
(:class:`ReceiverBusy`) and the notifier defers it to the ledger, so that the broker
window it held (an unacked message) goes to other receivers' deliveries. Memory is
bounded by the deliveries in flight: a receiver nobody holds or waits for is forgotten.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from yarl import URL

from relay_batches.errors import TransientError


class ReceiverBusy(TransientError):
    """The receiver has every slot taken and too many deliveries waiting, or the wait ran
    out: hand the delivery back for later."""


def receiver_key(workspace_id: str, url: str) -> tuple[str, str]:
    """The receiver a webhook URL names: the workspace and the URL's ``host:port``."""
    try:
        parsed = URL(url)
        authority = f"{(parsed.host or '').lower()}:{parsed.port}"
    except ValueError:
        authority = url
    return workspace_id, authority


@dataclass
class _Receiver:
    slots: asyncio.Semaphore
    users: int = 0  # holding a slot or waiting for one


@dataclass
class ReceiverGate:
    """Per-receiver slots with a bounded wait (see the module doc)."""

    slots: int
    waiters: int
    wait_s: float
    _receivers: dict[tuple[str, str], _Receiver] = field(default_factory=dict)

    def in_use(self, key: tuple[str, str]) -> int:
        """Deliveries of receiver ``key`` holding or waiting for a slot."""
        receiver = self._receivers.get(key)
        return 0 if receiver is None else receiver.users

    @contextlib.asynccontextmanager
    async def slot(self, key: tuple[str, str], *, wait: bool = True) -> AsyncIterator[None]:
        """Hold one of ``key``'s slots for the block; :class:`ReceiverBusy` if none is
        free within the bounds (at once, without ``wait``)."""
        receiver = self._receivers.get(key)
        if receiver is None:
            receiver = self._receivers[key] = _Receiver(asyncio.Semaphore(self.slots))
        limit = self.slots + self.waiters if wait else self.slots
        if receiver.users >= limit:
            raise ReceiverBusy(f"receiver {key[1]} has {receiver.users} deliveries open")
        receiver.users += 1
        try:
            await self._acquire(receiver.slots, key)
            try:
                yield
            finally:
                receiver.slots.release()
        finally:
            receiver.users -= 1
            if receiver.users == 0:
                del self._receivers[key]

    async def _acquire(self, slots: asyncio.Semaphore, key: tuple[str, str]) -> None:
        try:
            async with asyncio.timeout(self.wait_s):
                await slots.acquire()
        except TimeoutError:
            raise ReceiverBusy(
                f"receiver {key[1]} had no free slot within {self.wait_s:g}s"
            ) from None
