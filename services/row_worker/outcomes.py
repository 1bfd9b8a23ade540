"""Collects row outcomes and publishes them several to an outcomes message, confirmed.

``add`` returns only once the message holding the outcome is confirmed by the broker, so
a slice is acked only after every one of its rows has a durable outcome. Outcomes are
gathered per results shard (:func:`~relay_batches.bus.topology.results_shard` of their
job), so a message only holds jobs of one shard and goes to that shard's queue. A message
goes out when it holds ``max_rows`` outcomes, or when its linger is over, and never grows
past ``max_bytes`` encoded (``RELAY_RESULTS_MESSAGE_BYTES``): an outcome that would cross
it first sends what is pending, and an outcome larger than ``max_bytes`` on its own
travels alone. What bounds such a one is the provider's reply, read up to
``router.MAX_REPLY_BYTES`` (8 MiB). The aggregator's memory bound rests on this cap: it
holds at most its prefetch of these messages.

The linger adapts to the shard's rate of outcomes (:func:`flush_linger`): while another
outcome is expected within ``flush_s``, a message waits up to ``flush_s`` after its first
outcome (at a high rate it fills to ``max_rows``); at a lower rate it goes out at once
(with the outcomes finished in the same event-loop turn), so latency stays low.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable

import orjson

from relay_batches.bus.topology import results_shard
from relay_batches.messages import OutcomesMessage, RowOutcome
from relay_batches.metrics import OUTCOME_UNCONFIRMED
from relay_batches.settings import Settings

log = logging.getLogger("relay.row_worker.outcomes")

Publish = Callable[[int, bytes], Awaitable[None]]  # (results shard, message body)

# An outcome is retried this long while the broker is away (a restart, an outage): it
# is held in memory meanwhile, bounded by the rows the worker holds (its prefetch).
PUBLISH_RETRY_FOR_S = 300.0
DRAIN_RETRY_S = 5.0  # once the service is stopping
RETRY_LOG_EVERY = 20  # one warning per this many failed attempts of a message
MAX_MESSAGE_BYTES = Settings.results_message_bytes  # RELAY_RESULTS_MESSAGE_BYTES's default
ENVELOPE_BYTES = 64  # a message's bytes around its outcomes: kind, keys, brackets
PUBLISH_RETRY_S = 0.5
RATE_TAU_S = 1.0  # the rate meter's memory: older arrivals weigh e-fold less per second


class RateMeter:
    """Events per second, an exponentially decaying count over ``tau_s``: at a steady
    rate ``r`` it reads ``r`` after a few ``tau_s``; when events stop it decays to 0."""

    def __init__(self, tau_s: float = RATE_TAU_S) -> None:
        self._tau = tau_s
        self._level = 0.0
        self._at = 0.0

    def tick(self, now: float) -> None:
        """Count one event at ``now`` (a monotonic clock, in seconds)."""
        self._level = self._decayed(now) + 1.0
        self._at = now

    def rate(self, now: float) -> float:
        """The events per second at ``now``."""
        return self._decayed(now) / self._tau

    def _decayed(self, now: float) -> float:
        return self._level * math.exp(-max(0.0, now - self._at) / self._tau)


def flush_linger(rate: float, flush_s: float) -> float:
    """How long a new message waits for more outcomes: ``flush_s`` while at least one
    more outcome is expected within it (``rate * flush_s >= 1``), else nothing."""
    return flush_s if rate * flush_s >= 1.0 else 0.0


class _Pending:
    """One shard's outcomes waiting to go out, and that shard's rate of outcomes."""

    def __init__(self) -> None:
        # Each outcome encoded once (its size is measured on that), and its confirm.
        self.items: list[tuple[bytes, asyncio.Future[None]]] = []
        self.bytes = 0
        self.timer: asyncio.TimerHandle | None = None
        self.meter = RateMeter()
        self.since = 0.0  # when its oldest pending outcome came (the loop's clock)


class OutcomePublisher:
    """Gathers outcomes into messages per results shard, by count, bytes or time; each
    ``add`` awaits its confirm."""

    def __init__(
        self,
        publish: Publish,
        max_rows: int,
        flush_s: float,
        max_bytes: int = MAX_MESSAGE_BYTES,
        shards: int = 1,
        retry_for_s: float = PUBLISH_RETRY_FOR_S,
    ) -> None:
        self._publish = publish
        self._retry_for_s = retry_for_s
        self._stop_by = math.inf
        self._max_rows = max_rows
        self._max_bytes = max_bytes
        self._flush_s = flush_s
        self._pending = [_Pending() for _ in range(shards)]
        self._flushes: set[asyncio.Task[None]] = set()

    async def add(self, outcome: RowOutcome) -> None:
        """Queue ``outcome`` for publishing and wait until the broker confirmed it."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        shard = results_shard(outcome.batch_id, len(self._pending))
        pending = self._pending[shard]
        now = loop.time()
        pending.meter.tick(now)
        encoded = orjson.dumps(outcome.as_list())
        size = len(encoded) + 1  # and its comma
        if pending.items and ENVELOPE_BYTES + pending.bytes + size > self._max_bytes:
            self._flush_now(shard)  # it would cross the cap: what is pending goes first
        if not pending.items:
            pending.since = now
        pending.items.append((encoded, future))
        pending.bytes += size
        if (
            len(pending.items) >= self._max_rows
            or ENVELOPE_BYTES + pending.bytes >= self._max_bytes
        ):
            self._flush_now(shard)
        elif pending.timer is None:
            linger = flush_linger(pending.meter.rate(loop.time()), self._flush_s)
            pending.timer = loop.call_later(linger, self._flush_now, shard)
        # Not shielded: a row task cancelled here cancels only its own future; the
        # outcome is already queued and still goes out with the rest.
        await future

    def flush_job(self, batch_id: str) -> None:
        """Send the outcomes waiting on ``batch_id``'s shard now (a slice's last row has
        its outcome: the slice is acked once they are confirmed)."""
        self._flush_now(results_shard(batch_id, len(self._pending)))

    def _flush_now(self, shard: int) -> None:
        pending = self._pending[shard]
        if pending.timer is not None:
            pending.timer.cancel()
            pending.timer = None
        if not pending.items:
            return
        items, pending.items = pending.items, []
        pending.bytes = 0
        task = asyncio.create_task(self._send(shard, items, pending.since), name="outcome-flush")
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _send(
        self, shard: int, items: list[tuple[bytes, asyncio.Future[None]]], since: float
    ) -> None:
        """Publish one message, retrying every :data:`PUBLISH_RETRY_S` while the broker is
        away, for up to ``retry_for_s`` (its rows' answers are paid for: an outcome given
        up is a row run again); then settle each outcome's confirm. Once confirmed, how
        long its oldest outcome waited since ``since`` is observed: the residual window
        of a crash (``relay_outcome_unconfirmed_seconds``)."""
        body = OutcomesMessage.encode_parts([encoded for encoded, _ in items])
        error: BaseException | None = None
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self._retry_for_s
        attempt = 0
        while True:
            try:
                await self._publish(shard, body)
                error = None
                OUTCOME_UNCONFIRMED.observe(loop.time() - since)
                break
            except asyncio.CancelledError as exc:
                error = exc
                break
            except Exception as exc:
                error = exc
                if attempt % RETRY_LOG_EVERY == 0:
                    log.warning(
                        "outcome_publish_failed",
                        extra={"attempt": attempt, "outcomes": len(items), "error": repr(exc)},
                    )
                attempt += 1
                if loop.time() + PUBLISH_RETRY_S >= min(give_up, self._stop_by):
                    break
                await asyncio.sleep(PUBLISH_RETRY_S)
        for _, future in items:
            if future.done():
                continue
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(RuntimeError(f"outcome publish failed: {error!r}"))

    async def drain(self) -> None:
        """Publish whatever is pending and wait for every flush in progress (a publish
        still failing is retried for :data:`DRAIN_RETRY_S` more at most: the service is
        stopping)."""
        self._stop_by = asyncio.get_running_loop().time() + DRAIN_RETRY_S
        for shard in range(len(self._pending)):
            self._flush_now(shard)
        if self._flushes:
            await asyncio.gather(*self._flushes, return_exceptions=True)
