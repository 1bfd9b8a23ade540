"""The row-worker loop: consume ``rows``, run each task, ack once its outcomes are confirmed."""

from __future__ import annotations

import asyncio
import logging
import math
import time

from aio_pika.abc import AbstractIncomingMessage

from relay_batches.bus.client import Bus, ack, reject
from relay_batches.bus.topology import EVENT_CANCELED
from relay_batches.messages import JobEvent, MessageError, SliceMessage
from relay_batches.metrics import MESSAGES_CONSUMED
from relay_batches.services.row_worker.batcher import OutcomeBatcher
from relay_batches.services.row_worker.core import RowRunner

log = logging.getLogger("relay.row_worker")


def rows_prefetch(concurrency: int, slice_rows: int) -> int:
    """Task messages to hold: rows for every slot twice over (a finished task stays unacked
    until its outcomes are confirmed, so its rows must not starve the slots), plus one."""
    return math.ceil(2 * concurrency / slice_rows) + 1


class RowWorkerService:
    """Wires the bus to a :class:`RowRunner` and drains it on stop."""

    def __init__(
        self,
        bus: Bus,
        runner: RowRunner,
        batcher: OutcomeBatcher,
        prefetch: int,
        grace_s: float,
    ) -> None:
        self._bus = bus
        self._runner = runner
        self._batcher = batcher
        self._prefetch = prefetch
        self._grace_s = grace_s
        self._handlers: set[asyncio.Task[None]] = set()
        self._consuming = False

    async def ready(self) -> bool:
        """Connected and consuming."""
        return self._consuming and self._bus.ready()

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop``; then stop intake and let in-flight tasks finish."""
        await self._bus.consume_events([EVENT_CANCELED], self._on_event)
        await self._bus.consume(self._bus.names.rows, self._on_slice, self._prefetch)
        self._consuming = True
        log.info("consuming", extra={"prefetch": self._prefetch})
        await stop.wait()
        await self._drain()

    async def _drain(self) -> None:
        self._consuming = False
        await self._bus.stop_consuming()
        pending = set(self._handlers)
        log.info("draining", extra={"tasks": len(pending)})
        if pending:
            _, late = await asyncio.wait(pending, timeout=self._grace_s)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=5)
                log.warning("tasks_handed_back", extra={"tasks": len(late)})
        await self._batcher.drain()

    async def _on_slice(self, message: AbstractIncomingMessage) -> None:
        handler = asyncio.create_task(self._handle(message), name="row-task")
        self._handlers.add(handler)
        handler.add_done_callback(self._handlers.discard)

    async def _handle(self, message: AbstractIncomingMessage) -> None:
        MESSAGES_CONSUMED.labels("rows").inc()
        try:
            task = SliceMessage.decode(message.body)
        except MessageError as exc:
            log.error("slice_rejected", extra={"error": str(exc)})
            await reject(message, requeue=False)
            return
        started = time.perf_counter()
        try:
            done = await self._runner.handle_slice(task)
        except asyncio.CancelledError:
            # Shutdown deadline: no ack; the broker redelivers the task to another worker.
            raise
        except Exception as exc:
            log.error("slice_failed", extra={"batch_id": task.batch_id, "error": repr(exc)})
            await reject(message, requeue=True)
            return
        await ack(message)
        log.debug(
            "slice_done",
            extra={
                "batch_id": task.batch_id,
                "rows": len(task.rows),
                "outcomes": done,
                "elapsed_ms": round((time.perf_counter() - started) * 1000, 1),
            },
        )

    async def _on_event(self, message: AbstractIncomingMessage) -> None:
        MESSAGES_CONSUMED.labels("event").inc()
        try:
            event = JobEvent.decode(message.body)
        except MessageError as exc:
            log.error("event_rejected", extra={"error": str(exc)})
            await reject(message, requeue=False)
            return
        aborted = self._runner.cancel_job(event.batch_id)
        log.info("job_canceled", extra={"batch_id": event.batch_id, "aborted": aborted})
        await ack(message)
