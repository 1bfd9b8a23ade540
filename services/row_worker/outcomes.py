"""Collects row outcomes and publishes them several to an outcomes message, confirmed.

``add`` returns only once the message holding the outcome is confirmed by the broker, so
a slice is acked only after every one of its rows has a durable outcome. A message goes
out when it holds ``max_rows`` outcomes, or ``flush_s`` after its first outcome, and
never grows past ``max_bytes`` encoded (``RELAY_RESULTS_MESSAGE_BYTES``): an outcome that
would cross it first sends what is pending, and an outcome larger than ``max_bytes`` on
its own travels alone. What bounds such a one is the provider's reply, read up to
``router.MAX_REPLY_BYTES`` (8 MiB). The aggregator's memory bound rests on this cap: it
holds at most its prefetch of these messages.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import orjson

from relay_batches.messages import OutcomesMessage, RowOutcome

log = logging.getLogger("relay.row_worker.outcomes")

Publish = Callable[[bytes], Awaitable[None]]

PUBLISH_ATTEMPTS = 20
MAX_MESSAGE_BYTES = 256 * 1024  # the default of RELAY_RESULTS_MESSAGE_BYTES
ENVELOPE_BYTES = 64  # a message's bytes around its outcomes: kind, keys, brackets
PUBLISH_RETRY_S = 0.5


class OutcomePublisher:
    """Gathers outcomes into messages by count, bytes or time; each ``add`` awaits its confirm."""

    def __init__(
        self, publish: Publish, max_rows: int, flush_s: float, max_bytes: int = MAX_MESSAGE_BYTES
    ) -> None:
        self._publish = publish
        self._max_rows = max_rows
        self._max_bytes = max_bytes
        self._flush_s = flush_s
        self._pending: list[tuple[RowOutcome, asyncio.Future[None]]] = []
        self._pending_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._flushes: set[asyncio.Task[None]] = set()

    async def add(self, outcome: RowOutcome) -> None:
        """Queue ``outcome`` for publishing and wait until the broker confirmed it."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        size = len(orjson.dumps(outcome.as_list())) + 1  # and its comma
        if self._pending and ENVELOPE_BYTES + self._pending_bytes + size > self._max_bytes:
            self._flush_now()  # it would cross the cap: what is pending goes first
        self._pending.append((outcome, future))
        self._pending_bytes += size
        if (
            len(self._pending) >= self._max_rows
            or ENVELOPE_BYTES + self._pending_bytes >= self._max_bytes
        ):
            self._flush_now()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._flush_s, self._flush_now)
        await asyncio.shield(future)

    def _flush_now(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._pending:
            return
        items, self._pending = self._pending, []
        self._pending_bytes = 0
        task = asyncio.create_task(self._send(items), name="outcome-flush")
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _send(self, items: list[tuple[RowOutcome, asyncio.Future[None]]]) -> None:
        body = OutcomesMessage(tuple(o for o, _ in items)).encode()
        error: BaseException | None = None
        for attempt in range(PUBLISH_ATTEMPTS):
            try:
                await self._publish(body)
                error = None
                break
            except asyncio.CancelledError as exc:
                error = exc
                break
            except Exception as exc:
                error = exc
                log.warning(
                    "outcome_publish_failed", extra={"attempt": attempt, "error": repr(exc)}
                )
                await asyncio.sleep(PUBLISH_RETRY_S)
        for _, future in items:
            if future.done():
                continue
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(RuntimeError(f"outcome publish failed: {error!r}"))

    async def drain(self) -> None:
        """Publish whatever is pending and wait for every flush in progress."""
        self._flush_now()
        if self._flushes:
            await asyncio.gather(*self._flushes, return_exceptions=True)
