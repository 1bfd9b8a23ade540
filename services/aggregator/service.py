"""The aggregator loop: take outcome messages in chunks, record, ack, announce.

A chunk is what arrives within ``linger_s`` of its first message, up to ``chunk``
messages; the messages are acked only after
the chunk's transaction committed and its events were confirmed. If recording fails
(database away), the chunk is requeued after a pause and redelivered later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from aio_pika.abc import AbstractIncomingMessage

from relay_batches.bus.client import Bus, ack, reject
from relay_batches.errors import PermanentError
from relay_batches.ledger.outcomes import JobProgress
from relay_batches.messages import RowOutcome
from relay_batches.metrics import MESSAGES_CONSUMED
from relay_batches.services.aggregator.core import Aggregator, decode_bodies

log = logging.getLogger("relay.aggregator")

RETRY_PAUSE_S = 1.0


class AggregatorService:
    """Wires the ``results`` queue to an :class:`Aggregator`."""

    def __init__(
        self,
        bus: Bus,
        aggregator: Aggregator,
        db_ready: Callable[[], Awaitable[bool]],
        prefetch: int,
        chunk: int,
        outbox_every_s: float,
        linger_s: float = 0.005,
    ) -> None:
        self._bus = bus
        self._aggregator = aggregator
        self._db_ready = db_ready
        self._prefetch = prefetch
        self._chunk = chunk
        self._outbox_every_s = outbox_every_s
        self._linger_s = linger_s
        self._inbox: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        self._consuming = False

    async def ready(self) -> bool:
        """Connected, consuming, and the database answered lately."""
        return self._consuming and self._bus.ready() and await self._db_ready()

    async def run(self, stop: asyncio.Event) -> None:
        """Record chunks until ``stop``; finish the chunk in hand, then close."""
        await self._bus.consume(self._bus.names.results, self._inbox.put, self._prefetch)
        self._consuming = True
        outbox = asyncio.create_task(self._outbox_loop(stop), name="outbox-scan")
        try:
            while not stop.is_set():
                chunk = await self._next_chunk(stop)
                if chunk:
                    await self._record(chunk)
        finally:
            self._consuming = False
            outbox.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await outbox
            await self._bus.stop_consuming()
        if outbox.done() and not outbox.cancelled() and outbox.exception():
            raise outbox.exception()  # type: ignore[misc]

    async def _next_chunk(self, stop: asyncio.Event) -> list[AbstractIncomingMessage]:
        getter = asyncio.ensure_future(self._inbox.get())
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not getter.done():
            getter.cancel()
            return []
        chunk = [getter.result()]
        deadline = asyncio.get_running_loop().time() + self._linger_s
        while len(chunk) < self._chunk:
            if self._inbox.empty():
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                try:
                    chunk.append(await asyncio.wait_for(self._inbox.get(), remaining))
                except TimeoutError:
                    break
            else:
                chunk.append(self._inbox.get_nowait())
        return chunk

    async def _record(self, chunk: list[AbstractIncomingMessage]) -> None:
        MESSAGES_CONSUMED.labels("results").inc(len(chunk))
        outcomes, bad = decode_bodies([m.body for m in chunk])
        started = time.perf_counter()
        try:
            progress = await self._record_outcomes(outcomes)
        except Exception as exc:
            log.error("record_failed", extra={"messages": len(chunk), "error": repr(exc)})
            await asyncio.sleep(RETRY_PAUSE_S)
            for message in chunk:
                await reject(message, requeue=True)
            return
        await self._settle(chunk, bad)
        log.debug(
            "chunk_recorded",
            extra={
                "messages": len(chunk),
                "outcomes": len(outcomes),
                "jobs": len(progress),
                "elapsed_ms": round((time.perf_counter() - started) * 1000, 1),
            },
        )

    @staticmethod
    async def _settle(chunk: list[AbstractIncomingMessage], bad: list[int]) -> None:
        """Ack the chunk (one ``multiple`` ack when every message was good: the chunk holds
        every earlier unsettled delivery of the channel, since chunks are taken in order and
        settled one at a time) and reject the undecodable messages."""
        if not bad:
            await ack(chunk[-1], multiple=True)
            return
        for position, message in enumerate(chunk):
            if position in bad:
                await reject(message, requeue=False)
            else:
                await ack(message)

    async def _record_outcomes(self, outcomes: list[RowOutcome]) -> list[JobProgress]:
        """Record a chunk; if the ledger refuses its data, record it outcome by outcome so
        one unstorable reply cannot hold back (or requeue) the rest forever."""
        try:
            return await self._aggregator.record(outcomes)
        except PermanentError as exc:
            log.error("chunk_refused", extra={"outcomes": len(outcomes), "error": str(exc)})
            await self._aggregator.record_each(outcomes)
            return []

    async def _outbox_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                announced = await self._aggregator.announce_unannounced(self._outbox_every_s)
                if announced:
                    log.info("outbox_announced", extra={"jobs": announced})
            except Exception as exc:
                log.warning("outbox_scan_failed", extra={"error": repr(exc)})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._outbox_every_s)
