"""Unit tests of the long-store slots: a bounded wait for one."""

from __future__ import annotations

import asyncio

import pytest

from relay_batches.errors import TransientError
from relay_batches.ledger.jobs import long_store_slot


async def test_a_store_waits_for_a_slot_then_takes_it_and_gives_it_back() -> None:
    slots = asyncio.Semaphore(1)
    async with long_store_slot(slots, wait_s=5):
        assert slots.locked()
    assert not slots.locked()


async def test_a_store_that_waits_past_its_bound_is_a_transient_error() -> None:
    slots = asyncio.Semaphore(0)  # every slot taken
    with pytest.raises(TransientError) as err:
        async with long_store_slot(slots, wait_s=0.05):
            pytest.fail("no slot was free")
    assert str(err.value) == "every long-store slot stayed taken for 0.05 s"
    slots.release()  # the slot it gave up on is still there for the next store
    async with long_store_slot(slots, wait_s=0.05):
        assert slots.locked()
