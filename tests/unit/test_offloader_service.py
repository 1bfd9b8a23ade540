"""Unit tests of the offloader's declaration: its passes, and a ledger pool large enough
for all of them at once with their lease renewals and readiness."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from relay_batches.services.offloader.inputs import run_in_thread
from relay_batches.services.offloader.service import (
    LEASED_PASSES,
    PASSES,
    POOL_SIZE,
    offloader_passes,
)


class Passes:
    """Stands in for the offloader: each pass does nothing."""

    async def intake_pass(self) -> None:
        return None

    async def submit_pass(self) -> None:
        return None

    async def poll_pass(self) -> None:
        return None

    async def forward_pass(self) -> None:
        return None


def test_the_pool_holds_every_pass_its_lease_renewals_and_readiness() -> None:
    stub: Any = Passes()
    periodic = offloader_passes(stub, 1.0)
    assert [p.name for p in periodic] == list(PASSES)
    assert set(LEASED_PASSES) <= set(PASSES)
    assert POOL_SIZE >= len(periodic) + len(LEASED_PASSES) + 1


async def test_a_cancelled_input_build_waits_for_its_thread_before_going_on() -> None:
    """The thread writing a page holds the input's descriptor: a cancel (the record's
    lease lost) must not let the caller close it while the thread still writes."""
    started, finished = threading.Event(), threading.Event()

    def slow_page() -> str:
        started.set()
        time.sleep(0.3)
        finished.set()
        return "written"

    task = asyncio.create_task(run_in_thread(slow_page))
    assert await asyncio.to_thread(started.wait, 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished.is_set()
