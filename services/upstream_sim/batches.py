"""What the simulator's two provider batch APIs share: the batch markers, how one batched
request is answered (as the realtime endpoint would, without latency or rate limits),
derived ids, bounded body reads, RFC 3339 times, cursor pages and the test delays of an
input and of a results download.

OpenAI's ``/v1/files`` and ``/v1/batches`` (:mod:`.openai_batches`) and Anthropic's
``/v1/messages/batches`` (:mod:`.anthropic_batches`; the headers of ``/v1/messages``, or
``Authorization: Bearer`` as the official SDK sends) answer each batched request exactly
as its realtime call would be (the markers of :mod:`.faults` included; no latency, rate
limit or hang, and not counted as ``calls``). A batch is done at the first poll at least
``SimConfig.batch_delay_s`` after its creation; ``batch_input_delay_s`` holds the answer to
an input (upload or create) and ``batch_results_pause_s`` stops a results download
halfway, so a test can meet a client mid-transfer. Markers in a batched request's last
user text (the realtime endpoints ignore them):

``[sim:batch-error]``    that request fails inside the batch (OpenAI: error file, status
                         500; Anthropic: ``errored`` with an ``api_error``)
``[sim:batch-expire]``   that request is left expired (OpenAI: error file with
                         ``batch_expired``, the batch ends ``expired``; Anthropic:
                         ``expired``)
``[sim:batch-fail]``     (OpenAI) the whole batch ends ``failed``, naming that line

``GET /stats`` adds ``batches_created``, ``batch_rows`` (requests submitted in batches)
and ``batch_rows_repeated`` (of those, custom_ids an earlier batch already submitted);
``POST /reset`` also forgets every file and batch.
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime

from aiohttp import StreamReader, web

from relay_batches.services.upstream_sim.config import SimConfig, Sleep
from relay_batches.services.upstream_sim.echo import ChatRequest
from relay_batches.services.upstream_sim.faults import decide_outcome
from relay_batches.services.upstream_sim.state import SimState

Clock = Callable[[], float]

BATCH_ERROR_MARKER = "[sim:batch-error]"
BATCH_EXPIRE_MARKER = "[sim:batch-expire]"
BATCH_FAIL_MARKER = "[sim:batch-fail]"
BATCH_ERROR_STATUS = 500
BATCH_ERROR_MESSAGE = "simulated failure of this request inside the batch ([sim:batch-error])"
EXPIRED = 0  # the status slot of a request left expired ([sim:batch-expire])
WINDOW_S = 24 * 3600  # both providers end a batch 24 hours after its creation
CHUNK = 500  # requests handled between two yields to the event loop
READ_CHUNK = 1 << 20
STREAM_BYTES = 1 << 20


Halfway = Callable[[], Awaitable[None]]


class BatchApi(abc.ABC):
    """What the routes of either batch API hold: the settings, the simulator's counters,
    the clock batches are timed by and what the test delays wait with."""

    def __init__(
        self, config: SimConfig, state: SimState, clock: Clock, sleep: Sleep = asyncio.sleep
    ) -> None:
        self._config = config
        self._state = state
        self._clock = clock
        self._sleep = sleep
        self.reset()

    @abc.abstractmethod
    def reset(self) -> None:
        """Forget every batch (each API holds its own)."""

    async def hold_input(self) -> None:
        """Wait ``SimConfig.batch_input_delay_s`` before an input is answered."""
        if self._config.batch_input_delay_s > 0:
            await self._sleep(self._config.batch_input_delay_s)

    async def halfway(self) -> None:
        """Stop a results download halfway for ``SimConfig.batch_results_pause_s``."""
        if self._config.batch_results_pause_s > 0:
            await self._sleep(self._config.batch_results_pause_s)


def batch_status(chat: ChatRequest, state: SimState, error_rate: float) -> int:
    """The answer of one batched request that passed the endpoint's validation: the HTTP
    status its realtime call would get now (fail-first counters move), 500 for
    ``[sim:batch-error]``, or :data:`EXPIRED` for ``[sim:batch-expire]``."""
    if BATCH_EXPIRE_MARKER in chat.last_user:
        return EXPIRED
    if BATCH_ERROR_MARKER in chat.last_user:
        return BATCH_ERROR_STATUS
    return decide_outcome(chat.triggers(), chat.last_user, state, error_rate).status


def is_batch_error(chat: ChatRequest) -> bool:
    """Whether ``[sim:batch-error]`` (and not ``[sim:batch-expire]``) decides ``chat``."""
    return BATCH_ERROR_MARKER in chat.last_user and BATCH_EXPIRE_MARKER not in chat.last_user


def derived_hex(size: int, *parts: object) -> str:
    """A stable id of ``size`` bytes in hex derived from ``parts`` (a batch's output reads
    the same at every download)."""
    text = "\n".join(str(part) for part in parts)
    return hashlib.blake2b(text.encode(), digest_size=size).hexdigest()


async def pause_every(index: int) -> None:
    """Give the event loop a turn after every :data:`CHUNK` requests."""
    if index % CHUNK == CHUNK - 1:
        await asyncio.sleep(0)


async def read_bounded(stream: StreamReader, cap: int) -> bytes | None:
    """Read a body of at most ``cap`` bytes; ``None`` (having read ``cap + 1``) if longer."""
    buffer = bytearray()
    async for chunk in stream.iter_chunked(READ_CHUNK):
        buffer += chunk
        if len(buffer) > cap:
            return None
    return bytes(buffer)


def rfc3339(timestamp: float | None) -> str | None:
    """A Unix time as Anthropic writes times (``2024-09-24T18:37:24.100435Z``)."""
    if timestamp is None:
        return None
    return datetime.fromtimestamp(timestamp, UTC).isoformat().replace("+00:00", "Z")


def cursor_page(
    ids: Sequence[str], limit: int, after: str | None, before: str | None = None
) -> tuple[list[str], bool]:
    """The page of ``ids`` (newest first) of at most ``limit`` right after ``after`` or
    right before ``before``, and whether more lie beyond it in that direction; a cursor
    that names no id gives an empty page."""
    if before is not None:
        if before not in ids:
            return [], False
        end = ids.index(before)
        start = max(0, end - limit)
        return list(ids[start:end]), start > 0
    start = 0
    if after is not None:
        if after not in ids:
            return [], False
        start = ids.index(after) + 1
    return list(ids[start : start + limit]), start + limit < len(ids)


def query_limit(raw: str | None, default: int, high: int) -> int | None:
    """A ``limit`` query parameter within 1..``high``; ``None`` when it is not one."""
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if 1 <= value <= high else None


async def jsonl_chunks(
    count: int, line: Callable[[int], bytes | None], halfway: Halfway | None = None
) -> AsyncIterator[bytes]:
    """The lines ``line(i)`` gives for ``i`` from ``count - 1`` down to 0 (``None``: no
    line), joined into pieces of about a MiB: a batch's results in reverse input order,
    so a client that relies on the order is caught. With ``halfway``, the first half of
    the lines goes out in full, then ``halfway`` is awaited before the rest."""
    buffer = bytearray()
    for step, index in enumerate(reversed(range(count))):
        rendered = line(index)
        if rendered is not None:
            buffer += rendered
        if halfway is not None and step + 1 == count // 2:
            if buffer:
                yield bytes(buffer)
                buffer.clear()
            await halfway()
        elif len(buffer) >= STREAM_BYTES:
            yield bytes(buffer)
            buffer.clear()
        await pause_every(step)
    if buffer:
        yield bytes(buffer)


async def stream(
    request: web.Request, chunks: AsyncIterator[bytes], content_type: str, size: int | None
) -> web.StreamResponse:
    """Answer ``request`` with ``chunks`` streamed (``size`` bytes, when known)."""
    response = web.StreamResponse(headers={"Content-Type": content_type})
    if size is not None:
        response.content_length = size
    await response.prepare(request)
    async for chunk in chunks:
        await response.write(chunk)
    await response.write_eof()
    return response
