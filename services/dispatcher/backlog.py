"""The backlog gauges' periodic pass: the dispatcher holding the ``backlog`` lease reads
the ledger's backlog (:mod:`relay_batches.ledger.backlog`) and serves it on its
``/metrics``; every other dispatcher serves none, so a sum over them counts once."""

from __future__ import annotations

import time

from relay_batches.kit.periodic import Periodic, every
from relay_batches.ledger.backlog import BacklogStore
from relay_batches.metrics import BACKLOG, BacklogGauges

# The lease outlives a few missed passes; a reading is served for as long.
LEASE_PASSES = 3


def backlog_pass(
    store: BacklogStore, owner: str, every_s: float, gauges: BacklogGauges = BACKLOG
) -> Periodic:
    """Every ``every_s``: take or renew the lease and show the reading, or show nothing
    while another dispatcher holds it. A failed pass leaves the last reading, served
    until it is ``LEASE_PASSES`` passes old."""
    lease_s = LEASE_PASSES * every_s

    async def read() -> None:
        reading = await store.read(owner, lease_s)
        if reading is None:
            gauges.hide()
            return
        gauges.show(
            reading.rows,
            reading.jobs,
            reading.oldest_queued_s,
            until=time.monotonic() + lease_s,
        )

    return every("backlog", every_s, read)
