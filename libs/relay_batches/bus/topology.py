"""Bus topology: every queue and exchange name, and the one place they are declared.

Priorities: RabbitMQ delivers the higher number first. On ``dispatch`` a wake-up carries
its job's priority clamped onto ``0..MAX_PRIORITY`` (the ledger keeps the exact order).
On ``rows`` the level is not the job's priority, which only orders jobs within their
workspace: the dispatcher sends every workspace's rows at level 0 and raises a job's
first rows only to overtake lower jobs of its own workspace, or, for a workspace with no
row in flight, the other workspaces' queued rows (``dispatcher/sharing.py``).

Queue types: ``dispatch`` and ``rows`` are always classic queues (their ten priority
levels exist only there); the other durable queues take ``RELAY_QUEUE_TYPE`` (classic or
quorum), see :meth:`Names.quorum_capable` and docs/operations/queue-types.md.
"""

from __future__ import annotations

import contextlib
import math
import re
import zlib
from dataclasses import dataclass

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange, AbstractQueue
from aiormq.exceptions import ChannelNotFoundEntity, ChannelPreconditionFailed
from pamqp.common import FieldTable

from relay_batches.settings import ConfigError, Settings

MAX_PRIORITY = 9


def rows_prefetch(concurrency: int, slice_rows: int) -> int:
    """Slice messages a row-worker holds: rows for every slot twice over (a finished slice
    stays unacked until its outcomes are confirmed, so its rows must not starve the
    slots), plus one. The dispatcher sizes its windows so every live worker gets them."""
    return math.ceil(2 * concurrency / slice_rows) + 1


DEAD_MAX_LENGTH = Settings.results_dead_max_length  # RELAY_RESULTS_DEAD_MAX_LENGTH's default
QUEUE_TYPES = ("classic", "quorum")  # RELAY_QUEUE_TYPE's values, the first the default
RESULTS_SHARDS = Settings.results_shards  # RELAY_RESULTS_SHARDS's default

EVENT_PROGRESS = "job.progress"
EVENT_FINISHED = "job.finished"
EVENT_CANCELED = "job.canceled"
# Row-workers hand back the unstarted rows of a paused job (see row_worker.controls) and
# withhold those of a job its budget stopped.
EVENT_PAUSED = "job.paused"
EVENT_BUDGET_STOPPED = "job.budget_stopped"
# A job's first rows went out above the base level (a priority or new-tenant boost):
# row-workers hand back the rows they hold and have not started of lower slices, so the
# broker can deliver the higher ones at once (see row_worker/start_gate.py).
EVENT_OVERTAKING = "job.overtaking"
EVENT_TEMPLATE_CREATED = "template.created"
EVENT_HOLDING = "worker.holding"
EVENT_THROTTLED = "ratelimit.throttled"
TICKS_PER_SECOND = 10  # the rate-limit keeper's ticks: a grants queue holds one second
# A tick's grant goes out in at most this many messages (a request each, up to 12,000
# rpm), so a grants queue holds one second of them: the same for every declarer, whatever
# its routes file says (a queue redeclared with other arguments is refused).
GRANT_MESSAGES_PER_TICK = 20
GRANTS_MAX_LENGTH = TICKS_PER_SECOND * GRANT_MESSAGES_PER_TICK
MAX_QUEUE_NAME_BYTES = 255  # AMQP's short string
GRANT_TTL_MS = 500  # none older is delivered: past its slot (pacing.LEAD_S + TICK_S ahead)
GRANTS_EXPIRE_MS = 3_600_000  # a grants queue unused for an hour is deleted
_ROUTING_WORD = re.compile(r"[^A-Za-z0-9_-]")


def event_kind(routing_key: str) -> str:
    """The kind of an event for metrics: its routing key without a routed word
    (``job.progress.<owner>`` counts as ``job.progress``, so labels stay few)."""
    return ".".join(routing_key.split(".")[:2])


def progress_key(owner: str) -> str:
    """The routing key of ``job.progress`` for the jobs of dispatcher ``owner``:
    ``job.progress.<owner>``, the owner as one topic word (a character that would split
    the word or act as a wildcard becomes ``_``; two owners that then share a word only
    see each other's events, which they ignore)."""
    return f"{EVENT_PROGRESS}.{_ROUTING_WORD.sub('_', owner) or '_'}"


def broker_priority(job_priority: int) -> int:
    """Map a job's integer priority onto the broker's few levels (higher first), for
    ``dispatch`` wake-ups."""
    return max(0, min(MAX_PRIORITY, job_priority))


def results_shard(batch_id: str, shards: int) -> int:
    """The results shard of a job: CRC-32 of its id modulo ``shards``, the same in every
    process and Python run (unlike ``hash()``, which is salted per process)."""
    return zlib.crc32(batch_id.encode()) % shards


@dataclass(frozen=True)
class Names:
    """Every bus name of one namespace, with the queue arguments every process of a
    namespace must declare the same: the dead-letter queue's length bound, the type of the
    queues that may be quorum queues, and the number of results shards."""

    namespace: str
    dead_max_length: int = DEAD_MAX_LENGTH
    queue_type: str = QUEUE_TYPES[0]
    shards: int = RESULTS_SHARDS

    @property
    def dispatch(self) -> str:
        """Queue of job ids ready to run."""
        return f"{self.namespace}.dispatch"

    @property
    def rows(self) -> str:
        """Queue of slice messages (consecutive rows of one job)."""
        return f"{self.namespace}.rows"

    @property
    def results(self) -> str:
        """The unsharded queue of outcome messages, from before the shards: aggregators
        still drain it (messages left by an upgrade, or moved back from the dead-letter
        queue), as competing consumers; row-workers no longer publish to it."""
        return f"{self.namespace}.results"

    def results_shard(self, shard: int) -> str:
        """Results shard queue ``shard`` (``0..shards-1``): the outcome messages of the jobs
        :func:`results_shard` maps there, taken by one aggregator at a time."""
        return f"{self.results}.{shard}"

    @property
    def results_shards(self) -> tuple[str, ...]:
        """Every results shard queue, in shard order."""
        return tuple(self.results_shard(k) for k in range(self.shards))

    @property
    def results_dead(self) -> str:
        """Dead-letter queue of outcome messages the ledger can never store (kept for an
        operator to look at; nothing consumes it): at most ``dead_max_length`` messages,
        the oldest dropped first."""
        return f"{self.results}.dead"

    @property
    def events(self) -> str:
        """Topic exchange for job events."""
        return f"{self.namespace}.events"

    @property
    def notify(self) -> str:
        """Queue bound to ``job.finished`` for the notifier."""
        return f"{self.namespace}.notify"

    @property
    def ratelimit_leader(self) -> str:
        """The exclusive queue whose holder is the rate-limit leader (issues grants)."""
        return f"{self.namespace}.ratelimit.leader"

    def ratelimit_grants(self, deployment: str) -> str:
        """Queue of one rate-limited deployment's grants (non-persistent, short-lived)."""
        return f"{self.namespace}.ratelimit.grants.{deployment}"

    def is_grants(self, queue: str) -> bool:
        """Whether ``queue`` is a grants queue."""
        return queue.startswith(f"{self.namespace}.ratelimit.grants.")

    def private(self, service: str, instance: str) -> str:
        """Name of a per-process exclusive queue."""
        return f"{self.namespace}.{service}.{instance}"

    def quorum_capable(self, queue: str) -> bool:
        """Whether ``queue`` may be a quorum queue: ``notify``, ``results`` and every queue
        under it (its dead-letter queue, its shards). Not ``dispatch`` and ``rows``: their
        priorities need classic queues, and the private queues are exclusive."""
        return queue in (self.notify, self.results) or queue.startswith(f"{self.results}.")

    def type_of(self, queue: str) -> str:
        """The ``x-queue-type`` a durable queue is declared with."""
        return self.queue_type if self.quorum_capable(queue) else "classic"

    def durable_queues(self) -> tuple[str, ...]:
        """Every durable queue of the namespace (tests delete them on teardown)."""
        return (
            self.dispatch,
            self.rows,
            self.results,
            *self.results_shards,
            self.results_dead,
            self.notify,
        )


async def declare_queue(channel: AbstractChannel, names: Names, queue: str) -> AbstractQueue:
    """Declare one of the durable queues with its arguments."""
    arguments: FieldTable = {}
    if queue in (names.dispatch, names.rows):
        arguments["x-max-priority"] = MAX_PRIORITY
    if queue == names.results_dead:
        # Nothing consumes it: bounded, keeping the newest. The queue is new with these
        # arguments; changing the length later means deleting the queue (after reading
        # it), since RabbitMQ refuses a redeclare with other arguments.
        arguments["x-max-length"] = names.dead_max_length
        arguments["x-overflow"] = "drop-head"
    arguments.update(_shard_arguments(names, queue))
    if names.is_grants(queue):
        # A grant is worth nothing a second later: the broker drops it then (or the
        # oldest when a second of messages is waiting), and the queue goes after an hour
        # unused (a deployment taken out of the routes).
        arguments["x-message-ttl"] = GRANT_TTL_MS
        arguments["x-max-length"] = GRANTS_MAX_LENGTH
        arguments["x-overflow"] = "drop-head"
        arguments["x-expires"] = GRANTS_EXPIRE_MS
    arguments["x-queue-type"] = names.type_of(queue)
    try:
        return await channel.declare_queue(queue, durable=True, arguments=arguments)
    except ChannelPreconditionFailed as exc:
        raise ConfigError(_mismatch(names, queue, exc)) from None


def _mismatch(names: Names, queue: str, exc: ChannelPreconditionFailed) -> str:
    """One line for a queue the broker holds with other arguments than this process's."""
    reply = " ".join(str(exc).split())
    if "'x-queue-type'" in reply:
        ours = f"type {names.type_of(queue)} (RELAY_QUEUE_TYPE={names.queue_type})"
    elif "'x-max-length'" in reply:
        ours = f"x-max-length {names.dead_max_length} (RELAY_RESULTS_DEAD_MAX_LENGTH)"
    else:
        ours = "arguments"
    return (
        f"queue {queue} exists on the broker with other arguments than this service's "
        f"{ours}: {reply}; set the value the queue was made with, or delete the queue once "
        "it is empty"
    )


def _shard_arguments(names: Names, queue: str) -> FieldTable:
    """A results shard has one active consumer at a time (the others wait as standbys and
    take over when it goes), so one job's outcomes are recorded by one aggregator."""
    if queue in names.results_shards:
        return {"x-single-active-consumer": True}
    return {}


async def check_shard_count(connection: AbstractConnection, names: Names) -> None:
    """Refuse to start when some process of the namespace runs with more results shards:
    the shard count is no queue argument, so a mismatch shows only as a shard queue past
    this process's last, ``<ns>.results.<K>``. A passive declare of it on a throwaway
    channel must fail with 404 (which closes that channel): the good case."""
    extra = names.results_shard(names.shards)
    channel = await connection.channel(publisher_confirms=False)
    try:
        await channel.declare_queue(extra, passive=True)
    except ChannelNotFoundEntity:
        return
    finally:
        # Closed by us even once the broker closed it: a robust channel reopens itself
        # after a broker-side close unless its owner closed it.
        with contextlib.suppress(Exception):
            await channel.close()
    raise ConfigError(
        f"RELAY_RESULTS_SHARDS={names.shards} but queue {extra} exists on the broker: some "
        "process of this namespace runs with a larger RELAY_RESULTS_SHARDS; give every "
        "process the same value (delete the extra shard queues once they are empty when "
        "lowering it)"
    )


async def declare_events(channel: AbstractChannel, names: Names) -> AbstractExchange:
    """Declare the events topic exchange."""
    return await channel.declare_exchange(names.events, aio_pika.ExchangeType.TOPIC, durable=True)


async def declare_all(channel: AbstractChannel, names: Names) -> None:
    """Declare the whole durable topology (idempotent); bind ``notify`` to finished."""
    events = await declare_events(channel, names)
    for queue in names.durable_queues():
        declared = await declare_queue(channel, names, queue)
        if queue == names.notify:
            await declared.bind(events, EVENT_FINISHED)
