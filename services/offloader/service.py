"""The offloader on the service kit: four periodic passes (intake and gathering,
submitting, polling and settling, forwarding), readiness (bus connected, ledger current)
and the common drain. It consumes no queue: its work is in the ledger."""

from __future__ import annotations

from relay_batches.kit.base import BusService, ReadyCheck, ServiceBus
from relay_batches.kit.periodic import every
from relay_batches.services.offloader.core import Offloader


def offloader_service(
    bus: ServiceBus, offloader: Offloader, ledger: ReadyCheck, *, every_s: float, grace_s: float
) -> BusService:
    """The offloader's declaration: each pass every ``every_s`` seconds."""
    periodic = [
        every("offload-intake", every_s, offloader.intake_pass),
        every("offload-submit", every_s, offloader.submit_pass),
        every("offload-poll", every_s, offloader.poll_pass),
        every("offload-forward", every_s, offloader.forward_pass),
    ]
    return BusService(bus, [], periodic=periodic, ledger=ledger, grace_s=grace_s)
