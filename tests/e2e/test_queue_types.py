"""RELAY_QUEUE_TYPE=quorum end to end on the broker we have (RabbitMQ 3.10): every service
its own process on a fresh namespace whose results, dead-letter and notify queues are
quorum queues (dispatch and rows stay classic for their priorities); a job runs through
them with its webhook, and a service started with the other setting stops with one line."""

from __future__ import annotations

import subprocess

import aio_pika
import aiohttp

from relay_batches.bus.topology import Names, declare_queue
from relay_batches.services.relay_cli import admin
from relay_batches.settings import ConfigError
from tests.helpers.processes import BIN, System, system_fixture
from tests.helpers.support import AMQP_URL, ApiClient, WebhookReceiver, rows, wait_until

# A system on a namespace declared with RELAY_QUEUE_TYPE=quorum.
quorum = system_fixture("quorum", RELAY_QUEUE_TYPE="quorum")


async def _declared_type(names: Names, queue: str) -> str | None:
    """Redeclare ``queue`` as ``names`` would; None when the broker agrees, else the error."""
    connection = await aio_pika.connect(AMQP_URL, timeout=10)
    async with connection:
        channel = await connection.channel()
        try:
            await declare_queue(channel, names, queue)
        except ConfigError as exc:
            return str(exc)
    return None


async def test_a_job_runs_through_quorum_queues_with_its_webhook(
    quorum: System, http: aiohttp.ClientSession, webhooks: WebhookReceiver
) -> None:
    key = await admin.create_key(quorum.iso.database_url, "quorum-a")
    api = ApiClient(quorum.api_url, key.key, http)
    created = await api.submit(
        {"model": "gpt-4o-mini", "requests": rows(40, "qq {i}"), "webhookUrl": webhooks.url}
    )
    batch = await api.wait_status(created["id"], {"completed"}, timeout=60)
    assert (batch["completed"], batch["failed"], batch["dead_letter"]) == (40, 0, 0)
    results = await api.results(created["id"])
    assert [(r["custom_id"], r["content"]) for r in results["data"]] == [
        (f"r-{i}", f"echo: qq {i}") for i in range(40)
    ]

    async def delivered() -> list[dict[str, object]]:
        return webhooks.for_batch(created["id"])

    await wait_until(delivered, 15, "the completion webhook")
    [hook] = webhooks.for_batch(created["id"])
    assert (hook["status"], hook["completed"]) == ("completed", 40)

    ns = quorum.iso.namespace
    as_quorum, as_classic = Names(ns, queue_type="quorum"), Names(ns)
    for queue in as_quorum.durable_queues():
        assert await _declared_type(as_quorum, queue) is None, queue
    # Declared classic, the quorum ones are refused by the broker; the priority ones agree.
    for queue in (as_classic.dispatch, as_classic.rows):
        assert await _declared_type(as_classic, queue) is None, queue
    for queue in (as_classic.results, as_classic.results_dead, as_classic.notify):
        error = await _declared_type(as_classic, queue)
        assert error is not None, queue
        assert error.startswith(
            f"queue {queue} exists on the broker with other arguments than this service's "
            "type classic (RELAY_QUEUE_TYPE=classic): PRECONDITION_FAILED - inequivalent arg "
            f"'x-queue-type' for queue '{queue}'"
        ), error
        assert "'quorum'" in error and "\n" not in error


def refused_aggregator(system: System, env: dict[str, str]) -> str:
    """Start ``relay-aggregator`` on ``system`` with ``env`` added: it must stop with exit
    code 2 and one line on stderr, returned."""
    env = {**system.base_env, **env, "RELAY_HEALTH_PORT": "0"}
    done = subprocess.run(
        [str(BIN / "relay-aggregator")], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    return line


def test_a_service_with_the_other_queue_type_stops_with_one_line(quorum: System) -> None:
    line = refused_aggregator(quorum, {"RELAY_QUEUE_TYPE": "classic"})
    results = Names(quorum.iso.namespace).results
    assert line.startswith(
        f"relay-aggregator: configuration error: queue {results} exists on the broker with "
        "other arguments than this service's type classic (RELAY_QUEUE_TYPE=classic): "
    ), line
    assert line.endswith(
        "set the value the queue was made with, or delete the queue once it is empty"
    )


def test_a_service_with_fewer_results_shards_stops_with_one_line(quorum: System) -> None:
    line = refused_aggregator(quorum, {"RELAY_RESULTS_SHARDS": "2"})
    results = Names(quorum.iso.namespace).results
    assert line == (
        f"relay-aggregator: configuration error: RELAY_RESULTS_SHARDS=2 but queue {results}.2 "
        "exists on the broker: some process of this namespace runs with a larger "
        "RELAY_RESULTS_SHARDS; give every process the same value (delete the extra shard "
        "queues once they are empty when lowering it)"
    ), line
