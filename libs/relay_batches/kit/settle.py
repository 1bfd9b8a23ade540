"""Settling deliveries: the ack policy, for single deliveries and for chunks.

This is the only module that acks, rejects or requeues a delivery (the consumers of
:mod:`~relay_batches.kit.consumer` and :mod:`~relay_batches.kit.chunks` call it). The
policy:

- ack once the handler returned: its effect is durable by then;
- reject without requeue a body that does not decode (a poison message);
- requeue, after a pause, when the handler raised: the failure may pass;
- requeue at once, quietly, when the handler hands the delivery back untouched
  (:class:`~relay_batches.errors.HandBack`: a stopping service starts no new work);
- except, on a chunked queue with a dead-letter queue, the messages its handler says can
  never be stored (:class:`~relay_batches.errors.UnstorableError`, raised once the rest
  of the chunk is recorded): each is published to the dead-letter queue, with a confirm,
  before it is acked, so a poison message is neither lost nor requeued forever;
- requeue, after a pause, when a chunk's handler raised; after :data:`FAIL_LIMIT` chunks
  failed in a row, step aside: cancel the consumers, requeue what the inbox holds, wait
  (up to :data:`STEP_ASIDE_S`, or until the ``recovered`` check passes), subscribe
  again. On a single-active-consumer queue a standby takes over meanwhile, so a replica
  that lost its database does not hold its queues forever;
- never settle on cancellation (the shutdown deadline): the broker redelivers;
- a settle on a channel closed since delivery (a reconnect) fails harmlessly, since
  the broker redelivers that message; it is logged and swallowed.

Each single delivery is handled in a task of its own, held by the service's
:class:`~relay_batches.kit.tasks.Tasks`, so a stop can wait for it and cancel it.
A chunked queue is taken by one loop, a chunk at a time, in delivery order: so when
every message of a chunk was good, one ``multiple`` ack of its last message settles
exactly that chunk (every earlier delivery of the channel was settled before).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from aio_pika.abc import AbstractIncomingMessage

from relay_batches.bus.client import SETTLE_ERRORS
from relay_batches.errors import HandBack
from relay_batches.messages import MessageError
from relay_batches.metrics import MESSAGES_CONSUMED
from relay_batches.tracing import attach_delivered, detach

log = logging.getLogger("relay.consumer")

T = TypeVar("T")


async def ack(message: AbstractIncomingMessage, *, multiple: bool = False) -> None:
    """Ack (with ``multiple``, every earlier delivery of its channel too)."""
    try:
        await message.ack(multiple=multiple)
    except SETTLE_ERRORS as exc:
        log.warning("ack_failed", extra={"error": repr(exc)})


async def reject(message: AbstractIncomingMessage, *, requeue: bool) -> None:
    """Reject, requeued or not (a poison message is dropped, or dead-lettered by policy)."""
    try:
        await message.nack(requeue=requeue)
    except SETTLE_ERRORS as exc:
        log.warning("nack_failed", extra={"error": repr(exc)})


async def settle_one(
    message: AbstractIncomingMessage,
    kind: str,
    decode: Callable[[AbstractIncomingMessage], T],
    handle: Callable[[T], Awaitable[object]],
    retry_pause_s: float,
) -> None:
    """Decode, handle and settle one delivery by the policy of the module doc."""
    MESSAGES_CONSUMED.labels(kind).inc()
    try:
        value = decode(message)
    except MessageError as exc:
        log.error("message_rejected", extra={"kind": kind, "error": str(exc)})
        await reject(message, requeue=False)
        return
    started = time.perf_counter()
    # The job's trace context its headers carry (W3C traceparent), current for the
    # handler: what it does of that job (a row-worker's rows) lands in the job's trace.
    traced = attach_delivered(message.headers)
    try:
        await handle(value)
    except asyncio.CancelledError:
        raise
    except HandBack:
        log.info("message_handed_back", extra={"kind": kind})
        await reject(message, requeue=True)
        return
    except Exception as exc:
        log.error("handler_failed", extra={"kind": kind, "error": repr(exc)})
        await asyncio.sleep(retry_pause_s)
        await reject(message, requeue=True)
        return
    finally:
        detach(traced)
    await ack(message)
    log.debug("message_done", extra={"kind": kind, "elapsed_ms": elapsed_ms(started)})


def elapsed_ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)


async def settle_chunk(chunk: Sequence[AbstractIncomingMessage], bad: set[int]) -> None:
    """One ``multiple`` ack when every message was good; else each message on its own."""
    if not bad:
        await ack(chunk[-1], multiple=True)
        return
    for position, message in enumerate(chunk):
        if position in bad:
            await reject(message, requeue=False)
        else:
            await ack(message)
