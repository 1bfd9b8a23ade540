"""Offloaded jobs on the real ledger for the offload tests: a running job its dispatcher
marked offloaded (every row released), and one whose rows are in a provider batch that
ended."""

from __future__ import annotations

from typing import Any

import asyncpg
import orjson

from relay_batches.ids import new_id
from relay_batches.ledger.dispatch import DispatchStore
from relay_batches.ledger.jobs import JobStore, NewJob
from relay_batches.ledger.keys import KeyStore
from relay_batches.ledger.offload import BatchState, Gathering, OffloadStore

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


def leads(deployment: str) -> dict[str, str]:
    """The leads of an intake that takes the test aliases' rows into ``deployment``."""
    return {"half": deployment, "other-half": deployment}


async def intake_all(store: OffloadStore, *args: Any, **kwargs: Any) -> None:
    """Run ``store.intake(*args, **kwargs)`` until it takes nothing more."""
    while await store.intake(*args, **kwargs):
        pass


async def ended_provider_batch(
    store: OffloadStore, pool: asyncpg.Pool, total: int, deployment: str, owner: str
) -> tuple[str, str, int]:
    """An offloaded job of ``total`` rows all in one provider batch that ended (leased to
    ``owner``): the job's id, its workspace and the record's id."""
    batch_id, workspace = await offloaded_job(pool, total, deployment)
    await intake_all(store, leads(deployment))
    made = await store.gather(Gathering(deployment, 100, 10_000_000, linger_s=0))
    assert made is not None
    assert made in [b.id for b in await store.claim(owner, [BatchState.RECORDED], 30, 100)]
    assert await store.set_submitted(made, owner, f"batch-{deployment}-{made}")
    assert await store.set_ended(made, owner, "file-out", None, None)
    return batch_id, workspace, made
