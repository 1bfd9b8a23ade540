"""Unit tests of the offloader's declaration: its passes, and a ledger pool large enough
for all of them at once with their lease renewals and readiness."""

from __future__ import annotations

from typing import Any

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
