"""The offloader's ledger: offloaded rows and the provider batches they go in.

A job its dispatcher offloaded (``batches.offload_deployment`` set, every row released)
is taken in by :meth:`OffloadStore.intake`: its released rows up to ``dispatched_upto``
become ``offload_rows`` in bounded steps, each row under the batch deployment that leads
its own alias (``pending``), or ``forward`` when none does (its alias runs realtime, or
the deployment left the routes file). :meth:`OffloadStore.gather` then cuts a deployment's
pending rows of running jobs into a provider batch when they reach its row or byte cap or
the oldest waited its linger: in one transaction the ``offload_batches`` record is made
(``recorded``) and its rows marked ``submitted``, before anything is sent, so a crash
never submits a row twice. The offloader then walks the record through ``creating``,
``submitted``, ``ended`` and ``settled`` with guarded, leased transitions (a lease per
record, taken ``FOR UPDATE SKIP LOCKED``, so replicas split them).

Every statement is set-based: no statement runs per row.
"""

from __future__ import annotations

from relay_batches.ledger.offload.records import (
    ANALYZE_AFTER_ROWS,
    DROP_WITHIN_S,
    INTAKE_STEP,
    BatchState,
    ForwardRow,
    Gathering,
    OffloadBatch,
    OffloadLine,
    PublishForward,
    RowState,
)
from relay_batches.ledger.offload.store import OffloadStore

__all__ = [
    "ANALYZE_AFTER_ROWS",
    "DROP_WITHIN_S",
    "INTAKE_STEP",
    "BatchState",
    "ForwardRow",
    "Gathering",
    "OffloadBatch",
    "OffloadLine",
    "OffloadStore",
    "PublishForward",
    "RowState",
]
