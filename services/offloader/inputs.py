"""Building a provider batch's input on disk, a bounded chunk of rows at a time.

The rows of the record are read from the ledger in keyset pages of :data:`PAGE` rows,
each built into its line by the provider client (the realtime request builder, the row's
params over the job's) and written to a temporary file in a worker thread, so memory
holds one page and the event loop neither builds lines nor writes to disk. A row the
provider cannot take (or whose stored request no longer decodes) is marked ``forward``
with its page: it goes realtime, to the alias's next deployment.

The gathering bounds a batch by its rows' stored sizes, an estimate (the job's params go
into every line, and a provider's format adds its own): the file itself never exceeds
the deployment's ``max_bytes``. Rows whose lines would cross it are put back ``pending``
(the next provider batch takes them); a row whose line alone would is forwarded.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from relay_batches.ledger.offload import OffloadLine, OffloadStore, RowState
from relay_batches.messages import row_request
from relay_batches.offload.lines import BatchClient
from relay_batches.prefixes import grouped
from relay_batches.router.types import UnsupportedRequest

T = TypeVar("T")

PAGE = 1_000
PAGE_BYTES = 8 * 1024 * 1024  # of row requests read at once (a row larger goes alone)


@dataclass(frozen=True, slots=True)
class BuiltInput:
    """An input file on disk: its path, the rows it holds and its size in bytes."""

    path: str
    rows: int
    size: int


def _line(client: BatchClient, offload_id: int, line: OffloadLine) -> bytes | None:
    """The row's input line, or None when it must go realtime instead."""
    try:
        request = row_request(orjson.loads(line.request))
        if request.endpoint is not None:  # its body is whole: no job params
            body = request.params or {}
            return client.line(
                offload_id, line.batch_id, line.row_index, (), body, request.endpoint
            )
        job_params = orjson.loads(line.params) if line.params else {}
        params = {**job_params, **(request.params or {})}
        return client.line(offload_id, line.batch_id, line.row_index, request.messages, params)
    except (UnsupportedRequest, orjson.JSONDecodeError, TypeError, ValueError):
        return None


def _request_of(line: OffloadLine) -> str:
    return line.request


def _append(fd: int, parts: list[bytes]) -> None:
    os.write(fd, b"".join(parts))


@dataclass(slots=True)
class _Page:
    """What one page put in the file, and its rows that went elsewhere."""

    rows: int = 0
    size: int = 0
    refused: list[tuple[str, int]] = field(default_factory=list)  # to go realtime
    surplus: list[tuple[str, int]] = field(default_factory=list)  # back to pending


def _write_page(
    fd: int,
    client: BatchClient,
    offload_id: int,
    page: list[OffloadLine],
    written: int,
    room: int | None,
    group_prefixes: bool = False,
) -> _Page:
    """Build and append one page's lines after the ``written`` ones before it, within
    ``room`` bytes (None: no cap; in a worker thread), grouped by request prefix when
    asked. Once a line does not fit, it and every row after it are surplus; a line that
    could never fit is refused."""
    if group_prefixes:
        page = grouped(page, _request_of)
    separator = client.frame()[1]
    parts: list[bytes] = []
    out = _Page()
    for line in page:
        key = (line.batch_id, line.row_index)
        if out.surplus:
            out.surplus.append(key)
            continue
        built = _line(client, offload_id, line)
        if built is None:
            out.refused.append(key)
            continue
        cost = len(built) + (len(separator) if written + out.rows else 0)
        if room is not None and cost > room:
            (out.refused if written + out.rows == 0 else out.surplus).append(key)
            continue
        if written + out.rows:
            parts.append(separator)
        parts.append(built)
        out.rows += 1
        out.size += cost
        if room is not None:
            room -= cost
    _append(fd, parts)
    return out


async def run_in_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker thread; cancelled meanwhile, wait for the thread to be
    done before the cancel goes on: the thread writes to a descriptor the caller closes
    on a cancel, and a closed descriptor's number may already be another file's or
    connection's by then (a page is bounded work: the wait is short)."""
    work = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        while not work.done():
            try:
                await asyncio.wait({work})
            except asyncio.CancelledError:
                continue
        raise


async def build_input(
    store: OffloadStore,
    client: BatchClient,
    offload_id: int,
    directory: str | None = None,
    group_prefixes: bool = False,
) -> BuiltInput:
    """Write record ``offload_id``'s input to a new temporary file (the caller removes
    it), at most its deployment's ``max_bytes``; rows that cannot go in are forwarded,
    rows beyond the cap put back pending. With ``group_prefixes`` each page's lines go
    in the order of their rows' request text (:mod:`relay_batches.prefixes`)."""
    opening, _, closing = client.frame()
    options = client.deployment.batch
    cap = None if options is None else options.max_bytes - len(opening) - len(closing)
    fd, path = tempfile.mkstemp(prefix=f"relay-offload-{offload_id}-", dir=directory)
    rows, size = 0, len(opening)
    try:
        await run_in_thread(_append, fd, [opening])
        after: tuple[str, int] | None = None
        while page := await store.lines(offload_id, after, PAGE, PAGE_BYTES):
            after = (page[-1].batch_id, page[-1].row_index)
            room = None if cap is None else cap - (size - len(opening))
            out = await run_in_thread(
                _write_page, fd, client, offload_id, page, rows, room, group_prefixes
            )
            await store.mark_rows(out.refused, RowState.FORWARD)
            await store.mark_rows(out.surplus, RowState.PENDING)
            rows, size = rows + out.rows, size + out.size
        size += len(closing)
        await run_in_thread(_append, fd, [closing])
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    return BuiltInput(path, rows, size)
