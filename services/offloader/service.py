"""The offloader on the service kit: four periodic passes (intake and gathering,
submitting, polling and settling, forwarding), readiness (bus connected, ledger current)
and the common drain. It consumes no queue: its work is in the ledger."""

from __future__ import annotations

from relay_batches.kit.base import BusService, ReadyCheck, ServiceBus
from relay_batches.kit.periodic import Periodic, every
from relay_batches.services.offloader.core import Offloader

# The passes whose steps renew a record's lease beside the step's own calls.
LEASED_PASSES = ("offload-submit", "offload-poll")
PASSES = ("offload-intake", *LEASED_PASSES, "offload-forward")
# The ledger connections the offloader may hold at once: one per pass (forward keeps its
# own across the broker's confirm), one per lease renewal, one for readiness.
POOL_SIZE = len(PASSES) + len(LEASED_PASSES) + 1


def offloader_passes(offloader: Offloader, every_s: float) -> list[Periodic]:
    """The periodic passes, each every ``every_s`` seconds (named as :data:`PASSES`)."""
    runs = {
        "offload-intake": offloader.intake_pass,
        "offload-submit": offloader.submit_pass,
        "offload-poll": offloader.poll_pass,
        "offload-forward": offloader.forward_pass,
    }
    return [every(name, every_s, runs[name]) for name in PASSES]


def offloader_service(
    bus: ServiceBus, offloader: Offloader, ledger: ReadyCheck, *, every_s: float, grace_s: float
) -> BusService:
    """The offloader's declaration: each pass every ``every_s`` seconds."""
    periodic = offloader_passes(offloader, every_s)
    return BusService(bus, [], periodic=periodic, ledger=ledger, grace_s=grace_s)
