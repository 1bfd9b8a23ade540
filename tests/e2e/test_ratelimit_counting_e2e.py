"""The shared rate limit held against a provider counting any second, wherever it starts
(a sliding window: ``RELAY_SIM_RATE_COUNTING=sliding``): three row-workers of 16 slots,
each its own OS process, the simulator enforcing 600 requests a minute, the routes
saying ``rpm = 600``. A :data:`ROWS`-row job runs at >= :data:`LEAST_SHARE` of the limit
(the simulator's 200s a second from its first answer to its last) with at most
:data:`MOST_429` of its calls answered 429. Calls that fit every sliding second fit
every calendar second and a bucket of a second's worth too; each of the three, at 600
and 3,000 rpm over longer jobs, is ``tests/bench/test_ratelimit_counting.py``'s."""

from __future__ import annotations

import aiohttp

from tests.helpers.paced import run_paced
from tests.helpers.processes import System, signed_in, system_fixture

RPM = 600
ROWS = 150  # 15 s at 10 calls a second
LEAST_SHARE = 0.95
MOST_429 = 0.01

sliding = system_fixture(
    "ratelimit-sliding",
    workers=3,
    sim_env={"RELAY_SIM_RPM": str(RPM), "RELAY_SIM_RATE_COUNTING": "sliding"},
    limits={"rpm": RPM},
    RELAY_BATCH_CONCURRENCY="16",
    RELAY_DISPATCH_WINDOW="256",
)


async def test_a_sliding_second_is_held_at_full_speed_with_few_429s(
    sliding: System, http: aiohttp.ClientSession
) -> None:
    api = await signed_in(sliding, http, "sliding")
    paced = await run_paced(http, sliding, api, ROWS, timeout_s=120)
    print("\n" + paced.line("e2e sliding", RPM / 60))
    assert paced.completed == ROWS
    assert paced.ok_per_s >= LEAST_SHARE * RPM / 60
    assert paced.throttled <= MOST_429 * paced.calls
