"""The row-worker's start gate: slots go to the best-ranked held slice, never lost."""

from __future__ import annotations

import asyncio

from relay_batches.services.row_worker.start_gate import StartGate


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_free_slots_are_taken_without_waiting() -> None:
    gate = StartGate(2)
    turn = gate.join(0)
    await gate.acquire(turn)
    await gate.acquire(turn)
    assert gate.free == 0
    gate.leave(turn)
    gate.release()
    gate.release()
    assert gate.free == 2


async def test_a_freed_slot_goes_to_the_higher_level_not_the_earlier_slice() -> None:
    gate = StartGate(1)
    running = gate.join(0)
    await gate.acquire(running)  # the only slot runs a row
    gate.leave(running)
    order: list[str] = []

    async def start(name: str, level: int) -> None:
        turn = gate.join(level)
        await gate.acquire(turn)
        order.append(name)
        gate.leave(turn)
        gate.release()  # its row ends at once

    held = asyncio.create_task(start("held", 0))
    await _settle()
    new_tenant = asyncio.create_task(start("new tenant", 1))
    await _settle()
    gate.release()  # the running row ends
    await asyncio.gather(held, new_tenant)
    assert order == ["new tenant", "held"]
    assert gate.free == 1


async def test_equal_levels_start_one_slice_after_another() -> None:
    gate = StartGate(1)
    first, second = gate.join(0), gate.join(0)
    order: list[str] = []

    async def run(name: str, turn: object, rows: int) -> None:
        for _ in range(rows):
            await gate.acquire(turn)  # type: ignore[arg-type]
            order.append(name)
            asyncio.get_running_loop().call_soon(gate.release)  # the row ends soon
        gate.leave(turn)  # type: ignore[arg-type]

    await asyncio.gather(run("second", second, 3), run("first", first, 3))
    assert order == ["first"] * 3 + ["second"] * 3


async def test_a_slot_granted_to_a_slice_that_leaves_goes_on() -> None:
    gate = StartGate(1)
    busy = gate.join(0)
    await gate.acquire(busy)
    gate.leave(busy)
    best, other = gate.join(5), gate.join(0)
    waiting = asyncio.create_task(gate.acquire(other))
    await _settle()
    gate.release()  # granted to ``best``, which is between rows, not waiting
    assert not waiting.done()
    gate.leave(best)  # it starts no more rows: the slot goes to ``other``
    await asyncio.wait_for(waiting, 1)
    gate.leave(other)
    gate.release()
    assert gate.free == 1


async def test_a_cancelled_waiter_loses_no_slot() -> None:
    gate = StartGate(1)
    busy = gate.join(0)
    await gate.acquire(busy)
    gate.leave(busy)
    turn = gate.join(0)
    waiting = asyncio.create_task(gate.acquire(turn))
    await _settle()
    gate.release()  # granted and woken ...
    waiting.cancel()  # ... but cancelled before it ran
    await asyncio.gather(waiting, return_exceptions=True)
    gate.leave(turn)  # the slot granted to it goes back
    assert gate.free == 1
    late = gate.join(0)
    await asyncio.wait_for(gate.acquire(late), 1)


async def test_overtake_tells_only_lower_slices_that_wait() -> None:
    gate = StartGate(1)
    busy = gate.join(0)
    assert await gate.acquire(busy)
    gate.leave(busy)
    low, same = gate.join(0), gate.join(2)
    low_wait = asyncio.create_task(gate.acquire(low))
    same_wait = asyncio.create_task(gate.acquire(same))
    await _settle()
    assert gate.overtake(2) == 1  # ``same`` is at the announced level: it keeps waiting
    assert await asyncio.wait_for(low_wait, 1) is False
    assert not same_wait.done()
    gate.leave(low)
    gate.release()  # the running row ends: the slot goes to ``same``
    assert await asyncio.wait_for(same_wait, 1) is True
    gate.leave(same)
    gate.release()
    assert gate.free == 1
