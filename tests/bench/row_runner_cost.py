"""What the row-worker's own code costs per row, without HTTP, a broker or a database.

A :class:`~relay_batches.services.row_worker.core.RowRunner` behind the paid-once
handler runs slices of 64 rows (two held at once, 32 slots) against a router that
answers at once, its outcomes gathered by the real
:class:`~relay_batches.services.row_worker.outcomes.OutcomePublisher` into a publish that
confirms at once. What is left is the runner, the start gate, paid-once, the outcome's
making and encoding: the part of a row's CPU that is Relay's own Python.

Run it under callgrind to count instructions, which, unlike seconds, do not depend on
what else the machine is doing; two sizes, so start-up and imports cancel out::

    for n in 20 120; do valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python -m tests.bench.row_runner_cost $n 1 2>&1 | grep Collected; done
    # instructions per row = (second - first) / (100 * 64)

Without valgrind it prints CPU microseconds per row (the best of five runs, or of as many
as the second argument says).
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import uvloop

from relay_batches.kit.consumer import Delivery
from relay_batches.messages import DecodedSlice, RowRequest
from relay_batches.router.types import Completion, RowResult
from relay_batches.services.row_worker.core import RowRunner
from relay_batches.services.row_worker.outcomes import OutcomePublisher
from relay_batches.services.row_worker.paid_once import AnsweredRows, PaidOnce

ROWS_PER_SLICE = 64
HELD = 2  # slices a worker holds at once (its prefetch)
CONCURRENCY = 32


class _AtOnce:
    """A router whose every row is answered at the next turn of the loop."""

    async def complete(
        self,
        alias: str,
        messages: Any,
        params: Any,
        workspace: str = "",
        endpoint: str | None = None,
    ) -> RowResult:
        await asyncio.sleep(0)
        return RowResult(Completion("hello there", 12, 3, None, "stop", "m"), None, 1, "sim")


async def run(slices: int) -> float:
    """Run ``slices`` slices; return the CPU seconds spent per row."""

    async def publish(shard: int, body: bytes) -> None:
        await asyncio.sleep(0)

    publisher = OutcomePublisher(publish, max_rows=256, flush_s=0.025)
    answered = AnsweredRows()
    runner = RowRunner(
        _AtOnce(), answered.sink(publisher.add), CONCURRENCY, flush=publisher.flush_job
    )
    handler = PaidOnce(runner.handle_slice, answered)
    request = RowRequest([{"role": "user", "content": "hi"}])
    held = asyncio.Semaphore(HELD)

    async def one(k: int) -> None:
        rows = tuple((k * ROWS_PER_SLICE + i, request) for i in range(ROWS_PER_SLICE))
        async with held:
            await handler.handle(Delivery(DecodedSlice(f"batch_{k % 8}", "m", rows), False, _open))

    started = time.process_time()
    await asyncio.gather(*(one(k) for k in range(slices)))
    return (time.process_time() - started) / (slices * ROWS_PER_SLICE)


def _open() -> bool:
    return True


def main() -> None:
    """``python -m tests.bench.row_runner_cost [slices [runs]]``: CPU microseconds per row."""
    slices = int(sys.argv[1]) if len(sys.argv) > 1 else 600
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    best = min(uvloop.run(run(slices)) for _ in range(runs))
    print(f"row runner: {best * 1e6:.2f} us CPU per row ({slices} slices of {ROWS_PER_SLICE})")


if __name__ == "__main__":
    main()
