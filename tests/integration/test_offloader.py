"""The offloader's passes on the real ledger with a scripted provider client: a record
resumed after a crash between its create call and the ledger's note of it adopts the
provider batch it made (no second create), one resumed before any create creates once,
and an ended batch's answers are published as outcomes at the batch deployment's price
while its failed rows are forwarded as ordinary slices."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import aiohttp
import asyncpg
import orjson
import pytest

from relay_batches.ledger.offload import BatchState, OffloadStore
from relay_batches.messages import OutcomesMessage, SliceMessage
from relay_batches.offload.lines import ProviderError, ProviderState, ResultLine, parse_custom_id
from relay_batches.router.aliases import parse_aliases
from relay_batches.router.types import Completion, ProviderReply
from relay_batches.services.offloader.core import MAX_REFUSALS, OffloadConfig, Offloader
from tests.helpers.offload import offloaded_job


class ScriptedClient:
    """A provider batch API in memory: records every call; ``made`` is what ``find``
    answers; every line but those of ``failing`` rows is answered."""

    def __init__(self, deployment: Any, made: list[str] | None = None) -> None:
        self.deployment = deployment
        self.made = made or []
        self.creates: list[int] = []
        self.inputs: list[list[str]] = []
        self.failing: set[int] = set()
        self.pad = 0  # bytes added to every line

    def line(
        self,
        offload_id: int,
        batch_id: str,
        row_index: int,
        messages: Sequence[Mapping[str, Any]],
        params: Mapping[str, Any],
    ) -> bytes:
        value = f"{offload_id}-{batch_id}-{row_index}"
        return orjson.dumps({"custom_id": value, "pad": "p" * self.pad})

    def frame(self) -> tuple[bytes, bytes, bytes]:
        return b"", b"\n", b"\n"

    async def find(self, offload_id: int, rows: int, since: float) -> list[str]:
        return list(self.made)

    async def upload(self, offload_id: int, path: str) -> str | None:
        with open(path, "rb") as fh:  # noqa: ASYNC230 - a test's small file
            self.inputs.append([orjson.loads(line)["custom_id"] for line in fh if line.strip()])
        return f"file-{offload_id}"

    async def create(self, offload_id: int, path: str, input_file_id: str | None) -> str:
        self.creates.append(offload_id)
        return f"pb-{offload_id}"

    async def status(self, provider_id: str) -> ProviderState:
        return ProviderState(True, 1, output="out")

    async def cancel(self, provider_id: str) -> None:
        raise AssertionError("nothing is canceled here")

    async def results(self, state: ProviderState, offload_id: int) -> AsyncIterator[ResultLine]:
        for ids in self.inputs:
            for value in ids:
                key = parse_custom_id(value, offload_id)
                if key is None:
                    continue
                ok = key[1] not in self.failing
                reply = ProviderReply(Completion(f"answer {key[1]}", 1000, 2000)) if ok else None
                yield ResultLine(key[0], key[1], reply)


def routes(deployment: str, **options: Any) -> Any:
    return parse_aliases(
        {
            "deployments": {
                deployment: {
                    "provider": "openai-batch",
                    "base_url": "http://127.0.0.1:9/v1",
                    "model": "m",
                    "linger_s": 0,
                    **options,
                    "price": {"prompt_per_mtok": 1.0, "completion_per_mtok": 2.0},
                },
                "rt": {"provider": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"},
            },
            "aliases": {f"{deployment}-alias": {"deployments": [deployment, "rt"]}},
        },
        {},
    )


class Published:
    def __init__(self) -> None:
        self.outcomes: list[Any] = []
        self.slices: list[SliceMessage] = []

    async def outcome(self, shard: int, body: bytes) -> None:
        self.outcomes += OutcomesMessage.decode(body).outcomes

    async def slice(self, job_slice: SliceMessage) -> None:
        self.slices.append(job_slice)


def offloader(
    pool: asyncpg.Pool, deployment: str, client: ScriptedClient, out: Published
) -> Offloader:
    return Offloader(
        OffloadStore(pool),
        routes(deployment, max_bytes=client.deployment.batch.max_bytes),
        {deployment: client},
        out.outcome,
        out.slice,
        OffloadConfig(f"offloader-{deployment}", lease_s=30),
    )


async def record_of(pool: asyncpg.Pool, batch_id: str) -> asyncpg.Record:
    record = await pool.fetchrow(
        "SELECT b.id, b.state, b.provider_id, b.polls FROM offload_batches b"
        " WHERE b.id = (SELECT provider_batch FROM offload_rows WHERE batch_id = $1 LIMIT 1)",
        batch_id,
    )
    assert record is not None
    return record


async def crash_after_a_create_attempt(pool: asyncpg.Pool, offload_id: int) -> None:
    """What a crash between the counted create and the ledger's note of it leaves."""
    store = OffloadStore(pool)
    assert offload_id in [
        b.id for b in await store.claim("crashed", [BatchState.RECORDED], 30, 100)
    ]
    assert await store.attempt(offload_id, "crashed")
    await pool.execute("UPDATE offload_batches SET lease_until = now() WHERE id = $1", offload_id)


async def test_a_resumed_record_adopts_the_batch_it_made_and_creates_none(
    pool: asyncpg.Pool,
) -> None:
    client = ScriptedClient(routes("ob-adopt").batch_lead("ob-adopt-alias"), made=["pb-made"])
    out = Published()
    worker = offloader(pool, "ob-adopt", client, out)
    batch_id, _ = await offloaded_job(pool, 4, "ob-adopt", "ob-adopt-alias")
    await worker.intake_pass()
    record = await record_of(pool, batch_id)
    await crash_after_a_create_attempt(pool, record["id"])
    await worker.submit_pass()
    assert client.creates == []
    record = await record_of(pool, batch_id)
    assert (record["state"], record["provider_id"]) == ("submitted", "pb-made")


async def test_a_record_resumed_before_any_create_creates_once_and_settles(
    pool: asyncpg.Pool,
) -> None:
    client = ScriptedClient(routes("ob-once").batch_lead("ob-once-alias"))
    client.failing = {2}
    out = Published()
    worker = offloader(pool, "ob-once", client, out)
    batch_id, _ = await offloaded_job(pool, 5, "ob-once", "ob-once-alias")
    await pool.execute("UPDATE batches SET priority = 4 WHERE id = $1", batch_id)
    await worker.intake_pass()
    record = await record_of(pool, batch_id)
    await crash_after_a_create_attempt(pool, record["id"])
    await worker.submit_pass()
    assert client.creates == [record["id"]]
    assert len(client.inputs) == 1 and len(client.inputs[0]) == 5
    await worker.poll_pass()
    record = await record_of(pool, batch_id)
    assert record["state"] == "settled"

    mine = sorted((o for o in out.outcomes if o.batch_id == batch_id), key=lambda o: o.row_index)
    assert [o.row_index for o in mine] == [0, 1, 3, 4]
    assert {(o.deployment, o.attempts) for o in mine} == {("ob-once", 1)}
    assert mine[0].cost_usd == (1000 * 1.0 + 2000 * 2.0) / 1e6
    await worker.forward_pass()
    forwarded = [s for s in out.slices if s.batch_id == batch_id]
    assert [[r.index for r in s.rows] for s in forwarded] == [[2]]
    # The base level, as the dispatcher's own slices: a job's priority is not a level.
    assert (forwarded[0].model, forwarded[0].level) == ("ob-once-alias", 0)
    states = await pool.fetch(
        "SELECT row_index, state FROM offload_rows WHERE batch_id = $1 ORDER BY row_index",
        batch_id,
    )
    assert [r["state"] for r in states] == ["done", "done", "forwarded", "done", "done"]


class SlowUpload(ScriptedClient):
    """Uploads wait for ``release``; ``uploading`` is set once one waits."""

    def __init__(self, deployment: Any) -> None:
        super().__init__(deployment)
        self.uploading = asyncio.Event()
        self.release = asyncio.Event()

    async def upload(self, offload_id: int, path: str) -> str | None:
        self.uploading.set()
        await self.release.wait()
        return await super().upload(offload_id, path)


async def park_others(pool: asyncpg.Pool, deployment: str) -> None:
    """Put off the unsettled records other tests left (their deployments are not in this
    test's routes: a pass would end them first)."""
    await pool.execute(
        "UPDATE offload_batches SET next_poll_at = now() + interval '1 day'"
        " WHERE deployment <> $1 AND state <> 'settled'",
        deployment,
    )


async def two_records(pool: asyncpg.Pool, worker: Offloader, deployment: str) -> list[int]:
    """Two recorded provider batches of ``deployment``, oldest first."""
    await park_others(pool, deployment)
    for _ in range(2):
        await offloaded_job(pool, 2, deployment, f"{deployment}-alias")
        await worker.intake_pass()
    ids = await pool.fetch(
        "SELECT id FROM offload_batches WHERE deployment = $1 AND state = 'recorded' ORDER BY id",
        deployment,
    )
    assert len(ids) == 2
    return [r["id"] for r in ids]


async def test_a_record_waiting_behind_a_long_upload_is_not_leased_meanwhile(
    pool: asyncpg.Pool,
) -> None:
    client = SlowUpload(routes("ob-one").batch_lead("ob-one-alias"))
    worker = offloader(pool, "ob-one", client, Published())
    first, second = await two_records(pool, worker, "ob-one")
    running = asyncio.create_task(worker.submit_pass())
    try:
        await asyncio.wait_for(client.uploading.wait(), 30)
        other = OffloadStore(pool)
        taken = await other.claim("replica-b", [BatchState.RECORDED], 30, 10)
        assert [b.id for b in taken] == [second]
    finally:
        client.release.set()
        await asyncio.wait_for(running, 30)
    assert client.creates == [first]


async def test_a_record_taken_over_during_its_upload_is_not_created(pool: asyncpg.Pool) -> None:
    client = SlowUpload(routes("ob-lost").batch_lead("ob-lost-alias"))
    worker = offloader(pool, "ob-lost", client, Published())
    first, second = await two_records(pool, worker, "ob-lost")
    await pool.execute(
        "UPDATE offload_batches SET next_poll_at = now() + interval '1 hour' WHERE id = $1",
        second,
    )
    running = asyncio.create_task(worker.submit_pass())
    try:
        await asyncio.wait_for(client.uploading.wait(), 30)
        await pool.execute("UPDATE offload_batches SET owner = 'replica-b' WHERE id = $1", first)
    finally:
        client.release.set()
        await asyncio.wait_for(running, 30)
    assert client.creates == []
    state = await pool.fetchval("SELECT state FROM offload_batches WHERE id = $1", first)
    assert state == "recorded"


class FailingUpload(ScriptedClient):
    """The first upload fails with ``error``; the others pass."""

    def __init__(self, deployment: Any, error: BaseException) -> None:
        super().__init__(deployment)
        self.error: BaseException | None = error

    async def upload(self, offload_id: int, path: str) -> str | None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return await super().upload(offload_id, path)


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("enospc", OSError(errno.ENOSPC, "No space left on device")),
        ("payload", aiohttp.ClientPayloadError("connection lost")),
        ("timeout", TimeoutError()),
        ("ledger", asyncpg.SerializationError("could not serialize")),
    ],
)
async def test_a_record_failing_otherwise_than_the_provider_is_retried_alone(
    pool: asyncpg.Pool, name: str, error: BaseException
) -> None:
    deployment = f"ob-fail-{name}"
    client = FailingUpload(routes(deployment).batch_lead(f"{deployment}-alias"), error)
    worker = offloader(pool, deployment, client, Published())
    first, second = await two_records(pool, worker, deployment)
    await worker.submit_pass()
    assert client.creates == [second]
    failed = await pool.fetchrow(
        "SELECT state, error, lease_until, next_poll_at > now() AS later"
        " FROM offload_batches WHERE id = $1",
        first,
    )
    assert failed is not None
    assert (failed["state"], failed["lease_until"], failed["later"]) == ("recorded", None, True)
    assert failed["error"].startswith(error.__class__.__name__)


class Cancels(ScriptedClient):
    """A batch that runs until ``ended`` is set; cancels answer ``refusal`` (or pass)."""

    def __init__(self, deployment: Any, refusal: ProviderError | None) -> None:
        super().__init__(deployment)
        self.ended = False
        self.refusal = refusal
        self.cancels: list[str] = []

    async def status(self, provider_id: str) -> ProviderState:
        return ProviderState(True, 1, output="out") if self.ended else ProviderState(False, 0)

    async def cancel(self, provider_id: str) -> None:
        self.cancels.append(provider_id)
        if self.refusal is not None:
            raise self.refusal


async def submitted(
    pool: asyncpg.Pool, deployment: str, client: ScriptedClient
) -> tuple[Offloader, str, int]:
    """A submitted provider batch of a running 3-row job."""
    worker = offloader(pool, deployment, client, Published())
    await park_others(pool, deployment)
    batch_id, _ = await offloaded_job(pool, 3, deployment, f"{deployment}-alias")
    await worker.intake_pass()
    await worker.submit_pass()
    record = await record_of(pool, batch_id)
    assert record["state"] == "submitted"
    return worker, batch_id, record["id"]


async def submitted_of_a_canceled_job(
    pool: asyncpg.Pool, deployment: str, client: ScriptedClient
) -> tuple[Offloader, int]:
    """A submitted provider batch whose only job was canceled since: due for a poll."""
    worker, batch_id, offload_id = await submitted(pool, deployment, client)
    await pool.execute("UPDATE batches SET status = 'canceled' WHERE id = $1", batch_id)
    return worker, offload_id


async def due(pool: asyncpg.Pool, offload_id: int) -> None:
    await pool.execute(
        "UPDATE offload_batches SET next_poll_at = now(), lease_until = NULL WHERE id = $1",
        offload_id,
    )


async def test_an_ended_batch_of_canceled_jobs_is_settled_without_a_cancel(
    pool: asyncpg.Pool,
) -> None:
    client = Cancels(routes("ob-cx-ended").batch_lead("ob-cx-ended-alias"), None)
    worker, offload_id = await submitted_of_a_canceled_job(pool, "ob-cx-ended", client)
    client.ended = True
    await worker.poll_pass()
    assert client.cancels == []
    state = await pool.fetchval("SELECT state FROM offload_batches WHERE id = $1", offload_id)
    assert state == "settled"


@pytest.mark.parametrize(
    "refusal",
    [
        ProviderError("cancel: HTTP 409: already ending", permanent=False),
        ProviderError("cancel: HTTP 400: batch already completed", permanent=True),
    ],
)
async def test_a_refused_cancel_goes_on_polling_until_the_batch_ends(
    pool: asyncpg.Pool, refusal: ProviderError
) -> None:
    deployment = f"ob-cx-{'permanent' if refusal.permanent else 'conflict'}"
    client = Cancels(routes(deployment).batch_lead(f"{deployment}-alias"), refusal)
    worker, offload_id = await submitted_of_a_canceled_job(pool, deployment, client)
    await worker.poll_pass()
    assert len(client.cancels) == 1
    record = await pool.fetchrow(
        "SELECT state, error, polls FROM offload_batches WHERE id = $1", offload_id
    )
    assert record is not None
    assert (record["state"], record["error"], record["polls"]) == ("submitted", None, 1)
    client.ended = True
    await due(pool, offload_id)
    await worker.poll_pass()
    state = await pool.fetchval("SELECT state FROM offload_batches WHERE id = $1", offload_id)
    assert state == "settled"


class RefusedPolls(Cancels):
    """A submitted batch whose every poll the provider refuses for good."""

    async def status(self, provider_id: str) -> ProviderState:
        raise ProviderError("retrieve: HTTP 401: invalid key", permanent=True)


async def forwarded_rows(pool: asyncpg.Pool, batch_id: str) -> list[str]:
    return [
        r["state"]
        for r in await pool.fetch(
            "SELECT state FROM offload_rows WHERE batch_id = $1 ORDER BY row_index", batch_id
        )
    ]


async def test_a_batch_whose_polls_are_refused_for_good_ends_after_a_bound(
    pool: asyncpg.Pool,
) -> None:
    client = RefusedPolls(routes("ob-401").batch_lead("ob-401-alias"), None)
    worker, batch_id, offload_id = await submitted(pool, "ob-401", client)
    for _ in range(MAX_REFUSALS - 1):
        await worker.poll_pass()
        state = await pool.fetchval("SELECT state FROM offload_batches WHERE id = $1", offload_id)
        assert state == "submitted"
        await due(pool, offload_id)
    await worker.poll_pass()
    record = await pool.fetchrow(
        "SELECT state, error FROM offload_batches WHERE id = $1", offload_id
    )
    assert record is not None and record["state"] == "settled"
    assert "HTTP 401" in record["error"]
    assert await forwarded_rows(pool, batch_id) == ["forward"] * 3


async def test_a_refused_batch_past_its_window_ends_at_once(pool: asyncpg.Pool) -> None:
    client = RefusedPolls(routes("ob-late").batch_lead("ob-late-alias"), None)
    worker, batch_id, offload_id = await submitted(pool, "ob-late", client)
    await pool.execute(
        "UPDATE offload_batches SET created_at = now() - interval '26 hours' WHERE id = $1",
        offload_id,
    )
    await worker.poll_pass()
    state = await pool.fetchval("SELECT state FROM offload_batches WHERE id = $1", offload_id)
    assert state == "settled"
    assert await forwarded_rows(pool, batch_id) == ["forward"] * 3


async def test_rows_beyond_max_bytes_wait_for_the_next_provider_batch(pool: asyncpg.Pool) -> None:
    client = ScriptedClient(routes("ob-wide", max_bytes=4000).batch_lead("ob-wide-alias"))
    client.pad = 1500  # lines far larger than the rows' stored requests (long job params)
    out = Published()
    worker = offloader(pool, "ob-wide", client, out)
    await park_others(pool, "ob-wide")
    batch_id, _ = await offloaded_job(pool, 5, "ob-wide", "ob-wide-alias")
    for _ in range(4):
        await worker.intake_pass()
        await worker.submit_pass()
    assert [len(ids) for ids in client.inputs] == [2, 2, 1]
    sizes = await pool.fetch(
        "SELECT rows, bytes FROM offload_batches WHERE deployment = 'ob-wide' ORDER BY id"
    )
    assert [r["rows"] for r in sizes] == [2, 2, 1]
    assert all(r["bytes"] <= 4000 for r in sizes)
    sent = sorted(parse_custom_id(v, int(v.split("-")[0])) for ids in client.inputs for v in ids)
    assert sent == [(batch_id, i) for i in range(5)]


async def test_a_step_stops_as_soon_as_its_lease_renewal_finds_the_record_taken(
    pool: asyncpg.Pool,
) -> None:
    client = SlowUpload(routes("ob-taken").batch_lead("ob-taken-alias"))
    worker = Offloader(
        OffloadStore(pool),
        routes("ob-taken"),
        {"ob-taken": client},
        Published().outcome,
        Published().slice,
        OffloadConfig("offloader-ob-taken", lease_s=0.6),
    )
    first, second = await two_records(pool, worker, "ob-taken")
    await pool.execute(
        "UPDATE offload_batches SET next_poll_at = now() + interval '1 hour' WHERE id = $1",
        second,
    )
    running = asyncio.create_task(worker.submit_pass())
    await asyncio.wait_for(client.uploading.wait(), 30)
    await pool.execute("UPDATE offload_batches SET owner = 'replica-b' WHERE id = $1", first)
    await asyncio.wait_for(running, 30)  # the upload never ends: the renewal stopped it
    assert client.creates == [] and not client.release.is_set()
    owner = await pool.fetchval("SELECT owner FROM offload_batches WHERE id = $1", first)
    assert owner == "replica-b"
