"""Receiver isolation: at most a few POSTs in flight per receiver, and a bounded number
of open deliveries per workspace, so a hanging receiver only delays its own workspace.

A receiver is a workspace's URL authority (``host:port``): one workspace's slow endpoint
never takes the slots of another workspace, even on the same host. A delivery beyond
a receiver's slots waits for one, but neither long nor in numbers: it waits at most
``wait_s``, and at most ``waiters`` wait per receiver; past either bound it is refused
(:class:`ReceiverBusy`) and the notifier defers it to the ledger, so that the broker
window it held (an unacked message) goes to other receivers' deliveries.

A workspace may name many receivers (ports, wildcard subdomains), so on top of that a
workspace holds at most ``per_workspace`` deliveries open (holding or waiting for a
slot): one beyond is refused at once, without waiting. With the notifier's prefetch
above that cap, every other workspace always has room. Memory is bounded by the
deliveries in flight: a receiver or workspace nobody holds or waits for is forgotten.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from yarl import URL

from relay_batches.errors import TransientError

Key = tuple[str, str]


class ReceiverBusy(TransientError):
    """The receiver has every slot taken and too many deliveries waiting, the wait ran
    out, or the workspace has too many deliveries open: hand the delivery back for
    later."""


def receiver_key(workspace_id: str, url: str) -> Key:
    """The receiver a webhook URL names: the workspace and the URL's ``host:port``."""
    try:
        parsed = URL(url)
        authority = f"{(parsed.host or '').lower()}:{parsed.port}"
    except ValueError:
        authority = url
    return workspace_id, authority


@dataclass
class _Receiver:
    held: int = 0  # slots taken
    waiting: deque[asyncio.Future[None]] = field(default_factory=deque)
    urls: Counter[str] = field(default_factory=Counter)  # URLs of its open deliveries

    @property
    def users(self) -> int:
        return self.held + len(self.waiting)


@dataclass(frozen=True)
class Hold:
    """One slot of one receiver, taken by :meth:`ReceiverGate.reserve`."""

    key: Key
    url: str


@dataclass
class ReceiverGate:
    """Per-receiver slots with a bounded wait, and a cap of open deliveries per
    workspace (see the module doc)."""

    slots: int
    waiters: int
    wait_s: float
    per_workspace: int = 16
    _receivers: dict[Key, _Receiver] = field(default_factory=dict)
    _workspaces: Counter[str] = field(default_factory=Counter)

    def in_use(self, key: Key) -> int:
        """Deliveries of receiver ``key`` holding or waiting for a slot."""
        receiver = self._receivers.get(key)
        return 0 if receiver is None else receiver.users

    def open_in(self, workspace_id: str) -> int:
        """Deliveries of ``workspace_id`` holding or waiting for a slot."""
        return self._workspaces.get(workspace_id, 0)

    def full_workspaces(self) -> list[str]:
        """Workspaces with ``per_workspace`` deliveries open: none more is started."""
        return [w for w, n in self._workspaces.items() if n >= self.per_workspace]

    def busy_receivers(self) -> list[tuple[str, str]]:
        """``(workspace, url)`` of every open delivery whose receiver has no free slot."""
        return [
            (key[0], url)
            for key, receiver in self._receivers.items()
            if receiver.held >= self.slots
            for url in receiver.urls
        ]

    def reserve(self, workspace_id: str, url: str) -> Hold | None:
        """Take a free slot of the receiver of ``url`` at once; None if it has none or
        the workspace is full. Give it back with :meth:`release`."""
        key = receiver_key(workspace_id, url)
        receiver = self._receivers.get(key)
        if self.open_in(workspace_id) >= self.per_workspace:
            return None
        if receiver is not None and (receiver.held >= self.slots or receiver.waiting):
            return None
        receiver = self._open(key, url)
        receiver.held += 1
        return Hold(key, url)

    def release(self, hold: Hold) -> None:
        """Give back a slot; the longest waiter of its receiver gets it."""
        receiver = self._receivers[hold.key]
        while receiver.waiting:
            waiter = receiver.waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes on: held is unchanged
                self._close(hold.key, hold.url, receiver)
                return
        receiver.held -= 1
        self._close(hold.key, hold.url, receiver)

    @contextlib.asynccontextmanager
    async def slot(self, workspace_id: str, url: str, *, wait: bool = True) -> AsyncIterator[None]:
        """Hold one of the receiver's slots for the block; :class:`ReceiverBusy` if none
        is free within the bounds (at once, without ``wait``)."""
        hold = self.reserve(workspace_id, url)
        if hold is None:
            hold = await self._wait(workspace_id, url, wait)
        try:
            yield
        finally:
            self.release(hold)

    async def _wait(self, workspace_id: str, url: str, wait: bool) -> Hold:
        key = receiver_key(workspace_id, url)
        open_now = self.open_in(workspace_id)
        if open_now >= self.per_workspace:
            raise ReceiverBusy(f"workspace {workspace_id} has {open_now} deliveries open")
        receiver = self._receivers.get(key)
        users = 0 if receiver is None else receiver.users
        if not wait or users >= self.slots + self.waiters:
            raise ReceiverBusy(f"receiver {key[1]} has {users} deliveries open")
        receiver = self._open(key, url)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        receiver.waiting.append(waiter)
        try:
            async with asyncio.timeout(self.wait_s):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                # The slot was handed over just as the wait ended: it is ours, give it on.
                self.release(Hold(key, url))
            else:
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    receiver.waiting.remove(waiter)
                self._close(key, url, receiver)
            if isinstance(exc, TimeoutError):
                raise ReceiverBusy(
                    f"receiver {key[1]} had no free slot within {self.wait_s:g}s"
                ) from None
            raise
        return Hold(key, url)

    def _open(self, key: Key, url: str) -> _Receiver:
        receiver = self._receivers.get(key)
        if receiver is None:
            receiver = self._receivers[key] = _Receiver()
        receiver.urls[url] += 1
        self._workspaces[key[0]] += 1
        return receiver

    def _close(self, key: Key, url: str, receiver: _Receiver) -> None:
        receiver.urls[url] -= 1
        if receiver.urls[url] <= 0:
            del receiver.urls[url]
        self._workspaces[key[0]] -= 1
        if self._workspaces[key[0]] <= 0:
            del self._workspaces[key[0]]
        if receiver.users == 0:
            del self._receivers[key]
