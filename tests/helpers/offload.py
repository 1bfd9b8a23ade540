"""Offloaded jobs on the real ledger for the offload tests: a running job its dispatcher
marked offloaded (every row released)."""

from __future__ import annotations

import asyncpg
import orjson

from relay_batches.ids import new_id
from relay_batches.ledger.dispatch import DispatchStore
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore

OWNER = "dispatcher-offload-test"


def request(index: int, model: str | None = None) -> str:
    """A row's stored chat request: a bare messages array, or an object with a model."""
    messages = [{"role": "user", "content": f"row {index}"}]
    if model is None:
        return orjson.dumps(messages).decode()
    return orjson.dumps({"messages": messages, "model": model}).decode()


async def offloaded_job(
    pool: asyncpg.Pool,
    total: int,
    deployment: str,
    alias: str = "half",
    models: dict[int, str] | None = None,
) -> tuple[str, str]:
    """A running job of ``total`` rows on ``alias`` that its dispatcher offloaded to
    ``deployment``; rows in ``models`` carry their own alias. Its id and workspace."""
    workspace = await KeyStore(pool).ensure_workspace(f"off-{new_id()[:8]}")
    rows = ((f"c-{i}", request(i, (models or {}).get(i))) for i in range(total))
    job = await JobStore(pool).create(
        NewJob(new_id(), workspace, "off", alias, 0, total, None, None, None), rows
    )
    await pool.execute(
        "UPDATE batches SET status = 'running', lease_owner = $2,"
        " lease_expires_at = now() + interval '1 minute' WHERE id = $1",
        job.id,
        OWNER,
    )
    assert await DispatchStore(pool).offload(OWNER, job.id, total, deployment)
    return job.id, workspace
