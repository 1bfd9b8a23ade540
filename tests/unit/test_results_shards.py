"""Results shards and the adaptive flushes: the shard hash, the names, the settings,
the row-worker's rate meter and linger, the aggregator's chunk pace."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from relay_batches.bus.topology import Names, results_shard
from relay_batches.kit.pace import ChunkPace
from relay_batches.messages import OutcomesMessage, RowOutcome
from relay_batches.services.row_worker.outcomes import OutcomePublisher, RateMeter, flush_linger
from relay_batches.settings import ConfigError, Settings

WAIT_S = 5.0


def test_a_jobs_shard_is_crc32_of_its_id_and_the_same_in_another_python_run() -> None:
    ids = ["b1", "b2", "b4", "b5", "job-a"]
    assert [results_shard(i, 4) for i in ids] == [0, 2, 3, 1, 3]
    code = (
        "from relay_batches.bus.topology import results_shard;"
        f"print([results_shard(i, 4) for i in {ids!r}])"
    )
    other = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345"},
    )
    assert other.stdout.strip() == "[0, 2, 3, 1, 3]"
    assert {results_shard(f"job-{n}", 4) for n in range(100)} == {0, 1, 2, 3}
    assert results_shard("anything", 1) == 0


def test_shard_queue_names_never_clash_with_the_dead_letter_queue() -> None:
    names = Names("ns", shards=3)
    assert names.results_shards == ("ns.results.0", "ns.results.1", "ns.results.2")
    queues = names.durable_queues()
    assert len(set(queues)) == len(queues)
    assert set(names.results_shards) | {names.results, names.results_dead} <= set(queues)


def test_shard_settings() -> None:
    assert (Settings.from_env({}).results_shards, Settings.from_env({}).aggregator_shards) == (
        4,
        (),
    )
    chosen = Settings.from_env({"RELAY_RESULTS_SHARDS": "8", "RELAY_AGGREGATOR_SHARDS": "5, 2,5"})
    assert (chosen.results_shards, chosen.aggregator_shards) == (8, (2, 5))
    assert Settings.from_env({"RELAY_RESULTS_SHARDS": "0"}).results_shards == 1
    for bad in ("4", "x", "1,-1", ""):
        env = {"RELAY_AGGREGATOR_SHARDS": bad}
        if bad == "":
            assert Settings.from_env(env).aggregator_shards == ()
            continue
        with pytest.raises(ConfigError, match="RELAY_AGGREGATOR_SHARDS"):
            Settings.from_env(env)


def test_the_rate_meter_reads_a_steady_rate_and_decays_when_events_stop() -> None:
    meter = RateMeter(tau_s=1.0)
    for n in range(2000):
        meter.tick(n / 200)  # 200 a second for 10 s
    assert meter.rate(10.0) == pytest.approx(200, rel=0.05)
    assert meter.rate(15.0) < 2
    assert RateMeter().rate(3.0) == 0


def test_a_message_lingers_only_while_another_outcome_is_expected_within_the_flush() -> None:
    assert flush_linger(rate=100.0, flush_s=0.025) == 0.025  # 2.5 more expected
    assert flush_linger(rate=40.0, flush_s=0.025) == 0.025
    assert flush_linger(rate=10.0, flush_s=0.025) == 0.0  # a quarter of one: go now


def outcome(batch_id: str, index: int) -> RowOutcome:
    return RowOutcome(batch_id, index, "x", None, 1)


async def test_outcomes_are_grouped_per_shard_and_each_message_goes_to_its_jobs_shard() -> None:
    sent: list[tuple[int, OutcomesMessage]] = []

    async def publish(shard: int, body: bytes) -> None:
        sent.append((shard, OutcomesMessage.decode(body)))

    publisher = OutcomePublisher(publish, max_rows=100, flush_s=3600, shards=4)
    jobs = ["b1", "b2", "b4", "b3"]  # shards 0, 2, 3, 0
    adding = [asyncio.create_task(publisher.add(outcome(j, i))) for i in range(3) for j in jobs]
    await asyncio.sleep(0)
    await publisher.drain()
    await asyncio.wait_for(asyncio.gather(*adding), WAIT_S)
    by_shard = {shard: sorted((o.batch_id, o.row_index) for o in m.outcomes) for shard, m in sent}
    assert sorted(by_shard) == [0, 2, 3]
    for shard, rows in by_shard.items():
        assert {results_shard(b, 4) for b, _ in rows} == {shard}
    assert by_shard[0] == sorted([("b1", i) for i in range(3)] + [("b3", i) for i in range(3)])


async def test_a_lone_outcome_at_a_low_rate_goes_out_without_waiting_for_the_flush() -> None:
    sent: list[int] = []

    async def publish(shard: int, body: bytes) -> None:
        sent.append(len(OutcomesMessage.decode(body).outcomes))

    slow = OutcomePublisher(publish, max_rows=100, flush_s=0.5)
    await asyncio.wait_for(slow.add(outcome("b1", 0)), 0.25)  # no 500 ms linger
    assert sent == [1]


def test_the_chunk_grows_under_a_backlog_and_shrinks_back_when_quiet() -> None:
    pace = ChunkPace(base=64, most=256, linger_s=0.02)
    assert (pace.size, pace.linger) == (64, 0.02)
    pace.observe(taken=64, waiting=500, elapsed_s=0.005)
    pace.observe(taken=128, waiting=300, elapsed_s=0.005)
    assert pace.size == 256
    pace.observe(taken=256, waiting=100, elapsed_s=0.005)
    assert pace.size == 256  # never past the most
    pace.observe(taken=100, waiting=0, elapsed_s=0.005)
    assert pace.size == 128
    pace.observe(taken=1, waiting=0, elapsed_s=0.001)
    pace.observe(taken=1, waiting=0, elapsed_s=0.001)
    assert pace.size == 64  # never under the base


def test_a_full_chunk_whose_transaction_was_slow_grows_even_with_an_empty_inbox() -> None:
    pace = ChunkPace(base=8, most=64, linger_s=0.02)
    pace.observe(taken=8, waiting=0, elapsed_s=0.001)
    assert pace.size == 8
    pace.observe(taken=8, waiting=0, elapsed_s=0.05)
    assert pace.size == 16


def test_the_linger_grows_while_messages_keep_arriving_and_shrinks_when_a_chunk_is_alone() -> None:
    pace = ChunkPace(base=64, most=256, linger_s=0.02)
    pace.observe(taken=1, waiting=0, elapsed_s=0.002)
    assert pace.linger == 0.01
    for _ in range(10):
        pace.observe(taken=1, waiting=0, elapsed_s=0.002)
    assert pace.linger == 0.001  # never under 1 ms
    pace.observe(taken=1, waiting=3, elapsed_s=0.002)  # a backlog: arrivals again
    assert pace.linger == 0.002
    for _ in range(10):
        pace.observe(taken=5, waiting=0, elapsed_s=0.002)
    assert pace.linger == 0.02  # never past linger_s


def test_the_chunk_grows_no_larger_than_the_consumers_that_filled_it_may_hold() -> None:
    pace = ChunkPace(base=64, most=1024, linger_s=0.02)
    pace.observe(taken=64, waiting=500, elapsed_s=0.005, ceiling=64)  # one busy shard
    assert pace.size == 64
    pace.observe(taken=64, waiting=500, elapsed_s=0.005, ceiling=192)  # three busy shards
    pace.observe(taken=128, waiting=500, elapsed_s=0.005, ceiling=192)
    assert pace.size == 192
    pace.observe(taken=192, waiting=500, elapsed_s=0.005, ceiling=32)
    assert pace.size == 64  # never under the base


def test_a_pace_whose_most_is_below_its_base_keeps_the_base() -> None:
    pace = ChunkPace(base=64, most=0, linger_s=0.0)
    pace.observe(taken=64, waiting=10, elapsed_s=1.0)
    assert (pace.size, pace.linger) == (64, 0.0)


def test_a_reset_pace_starts_over_at_the_base_size_and_the_longest_linger() -> None:
    pace = ChunkPace(base=8, most=64, linger_s=0.02)
    pace.observe(taken=8, waiting=100, elapsed_s=0.001)
    assert pace.size == 16
    pace.reset()
    assert pace.size == 8
    pace.observe(taken=1, waiting=0, elapsed_s=0.001)
    assert pace.linger == 0.01
    pace.reset()
    assert (pace.size, pace.linger) == (8, 0.02)
