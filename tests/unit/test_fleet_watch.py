"""The ingest-api's view of the fleet (services/ingest_api/fleet.py): the latest heartbeat
per worker until its ttl passes, the latest 429 per deployment for a minute, bounded."""

from __future__ import annotations

from relay_batches.messages import HeldRows, HoldingReport, ThrottledEvent
from relay_batches.services.ingest_api import fleet
from relay_batches.services.ingest_api.fleet import FleetWatch


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def report(worker: str, *rows: int, ttl_s: float = 5.0) -> HoldingReport:
    """A heartbeat of ``worker`` holding ``rows`` of job ``j``."""
    return HoldingReport(worker, ttl_s, (HeldRows("j", rows),), concurrency=8)


def test_a_heartbeat_replaces_the_last_and_expires_after_its_ttl() -> None:
    clock = Clock()
    watch = FleetWatch(clock=clock)
    watch.on_holding(report("w-b", 1, 2))
    watch.on_holding(report("w-a", 3, ttl_s=2.0))
    watch.on_holding(report("w-b", 4))
    assert [(s.report.worker, s.report.held[0].rows) for s in watch.live()] == [
        ("w-a", (3,)),
        ("w-b", (4,)),
    ]
    clock.now += 3.0  # past w-a's ttl, not w-b's
    assert [s.report.worker for s in watch.live()] == ["w-b"]


def test_a_throttle_is_shown_for_a_minute() -> None:
    clock = Clock()
    watch = FleetWatch(clock=clock)
    watch.on_throttled(ThrottledEvent("sim", 7.0))
    clock.now += 10.0
    assert watch.throttles() == [{"deployment": "sim", "retry_after_s": 7.0, "seconds_ago": 10.0}]
    clock.now += fleet.THROTTLE_SHOWN_S
    assert watch.throttles() == []


def test_memory_is_bounded_by_the_caps() -> None:
    watch = FleetWatch(clock=Clock())
    for i in range(fleet.MAX_WORKERS + 5):
        watch.on_holding(report(f"w-{i:05d}", 1))
    assert len(watch.live()) == fleet.MAX_WORKERS
    watch.on_holding(report("w-00000", 9))  # a known worker still reports
    assert watch.workers["w-00000"].report.held[0].rows == (9,)
