"""The shared rate limit held whichever way the provider counts its second: three
row-workers of 16 slots (each its own OS process) against a simulator enforcing 600
requests a minute per calendar second, over any sliding second, or as a token bucket of
a second's worth (``RELAY_SIM_RATE_COUNTING``), the routes saying ``rpm = 600``. A
:data:`ROWS`-row job runs at >= :data:`LEAST_SHARE` of the limit (the simulator's 200s a
second from the first to the last) with at most :data:`MOST_429` of its calls answered
429. The longer runs, and 3,000 rpm, are ``tests/bench/test_ratelimit_counting.py``'s."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from relay_batches.settings.tools import RATE_COUNTINGS
from tests.helpers.paced import run_paced
from tests.helpers.processes import System, running_system, signed_in

RPM = 600
ROWS = 150  # 15 s at 10 calls a second
LEAST_SHARE = 0.95
MOST_429 = 0.01


@pytest.fixture(scope="module", params=RATE_COUNTINGS)
async def limited(
    request: pytest.FixtureRequest, output_dir: Path, http: aiohttp.ClientSession
) -> AsyncIterator[System]:
    """Three row-workers against a simulator counting its limit as ``request.param``."""
    counting = str(request.param)
    async with running_system(
        f"counting{counting}",
        output_dir / f"e2e-ratelimit-{counting}",
        http,
        workers=3,
        sim_env={"RELAY_SIM_RPM": str(RPM), "RELAY_SIM_RATE_COUNTING": counting},
        limits={"rpm": RPM},
        RELAY_BATCH_CONCURRENCY="16",
        RELAY_DISPATCH_WINDOW="256",
    ) as system:
        yield system


async def test_the_limit_holds_at_full_speed_with_few_429s(
    limited: System, http: aiohttp.ClientSession, request: pytest.FixtureRequest
) -> None:
    api = await signed_in(limited, http, "counting")
    paced = await run_paced(http, limited, api, ROWS, timeout_s=120)
    print("\n" + paced.line(f"e2e {request.node.callspec.id}", RPM / 60))
    assert paced.completed == ROWS
    assert paced.ok_per_s >= LEAST_SHARE * RPM / 60
    assert paced.throttled <= MOST_429 * paced.calls
