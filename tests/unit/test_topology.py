"""Unit tests of the bus names: which durable queues take RELAY_QUEUE_TYPE."""

from __future__ import annotations

from relay_batches.bus.topology import Names
from relay_batches.settings import Settings
from relay_batches.wiring import bus_names


def test_only_the_queues_without_priorities_may_be_quorum_queues() -> None:
    names = Names("ns", queue_type="quorum", shards=2)
    capable = [q for q in names.durable_queues() if names.quorum_capable(q)]
    assert capable == ["ns.results", "ns.results.0", "ns.results.1", "ns.results.dead", "ns.notify"]
    # Any queue under results (its shards) is capable; the priority queues never are.
    assert names.quorum_capable("ns.results.3")
    assert not names.quorum_capable("ns.resultsx")
    assert [names.type_of(q) for q in names.durable_queues()] == [
        "classic",
        "classic",
        "quorum",
        "quorum",
        "quorum",
        "quorum",
        "quorum",
    ]


def test_every_queue_is_classic_by_default() -> None:
    names = Names("ns")
    assert {names.type_of(q) for q in names.durable_queues()} == {"classic"}


def test_the_services_names_carry_the_settings() -> None:
    settings = Settings.from_env(
        {
            "RELAY_NAMESPACE": "n1",
            "RELAY_QUEUE_TYPE": "quorum",
            "RELAY_RESULTS_DEAD_MAX_LENGTH": "7",
        }
    )
    assert bus_names(settings) == Names("n1", dead_max_length=7, queue_type="quorum")
