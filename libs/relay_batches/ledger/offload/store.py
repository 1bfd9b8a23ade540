"""The offload ledger's one store: :class:`OffloadStore`, its parts put together."""

from __future__ import annotations

from relay_batches.ledger.offload.batches import ProviderBatches
from relay_batches.ledger.offload.intake import Intake
from relay_batches.ledger.offload.moving import Moving
from relay_batches.ledger.offload.settling import Settling


class OffloadStore(Intake, ProviderBatches, Settling, Moving):
    """Offloaded rows and provider batches on a pool: intake and gathering
    (:mod:`~relay_batches.ledger.offload.intake`), the provider batch's life
    (:mod:`~relay_batches.ledger.offload.batches`), settling and forwarding
    (:mod:`~relay_batches.ledger.offload.settling`), moving rows to faster lanes
    (:mod:`~relay_batches.ledger.offload.moving`)."""
