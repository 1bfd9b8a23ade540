"""Building a provider batch's input on disk, a bounded chunk of rows at a time.

The rows of the record are read from the ledger in keyset pages of :data:`PAGE` rows,
each built into its line by the provider client (the realtime request builder, the row's
params over the job's) and written to a temporary file in a worker thread, so memory
holds one page and the event loop neither builds lines nor writes to disk. A row the
provider cannot take (or whose stored request no longer decodes) is marked ``forward``
with its page: it goes realtime, to the alias's next deployment.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from dataclasses import dataclass

import orjson

from relay_batches.ledger.offload import OffloadLine, OffloadStore, RowState
from relay_batches.messages import row_request
from relay_batches.offload.lines import BatchClient
from relay_batches.router.types import UnsupportedRequest

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
        job_params = orjson.loads(line.params) if line.params else {}
        params = {**job_params, **(request.params or {})}
        return client.line(offload_id, line.batch_id, line.row_index, request.messages, params)
    except (UnsupportedRequest, orjson.JSONDecodeError, TypeError, ValueError):
        return None


def _append(fd: int, parts: list[bytes]) -> None:
    os.write(fd, b"".join(parts))


def _write_page(
    fd: int, client: BatchClient, offload_id: int, page: list[OffloadLine], written: int
) -> tuple[int, int, list[tuple[str, int]]]:
    """Build and append one page's lines after the ``written`` ones before it (in a
    worker thread): how many rows and bytes it wrote, and the rows it could not take."""
    separator = client.frame()[1]
    parts: list[bytes] = []
    refused: list[tuple[str, int]] = []
    rows = 0
    for line in page:
        built = _line(client, offload_id, line)
        if built is None:
            refused.append((line.batch_id, line.row_index))
            continue
        if written + rows:
            parts.append(separator)
        parts.append(built)
        rows += 1
    _append(fd, parts)
    return rows, sum(len(p) for p in parts), refused


async def build_input(
    store: OffloadStore, client: BatchClient, offload_id: int, directory: str | None = None
) -> BuiltInput:
    """Write record ``offload_id``'s input to a new temporary file (the caller removes
    it); rows that cannot go in are forwarded."""
    opening, _, closing = client.frame()
    fd, path = tempfile.mkstemp(prefix=f"relay-offload-{offload_id}-", dir=directory)
    rows, size = 0, len(opening)
    try:
        await asyncio.to_thread(_append, fd, [opening])
        after: tuple[str, int] | None = None
        while page := await store.lines(offload_id, after, PAGE, PAGE_BYTES):
            after = (page[-1].batch_id, page[-1].row_index)
            written, length, refused = await asyncio.to_thread(
                _write_page, fd, client, offload_id, page, rows
            )
            await store.mark_rows(refused, RowState.FORWARD)
            rows, size = rows + written, size + length
        size += len(closing)
        await asyncio.to_thread(_append, fd, [closing])
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    return BuiltInput(path, rows, size)
