"""The shared rate limit whichever way the provider counts its second (``make bench``;
issue 27, item 5): three row-workers x 16 against the simulator enforcing
``rpm`` per calendar second, over any sliding second, or as a token bucket of a second's
worth (``RELAY_SIM_RATE_COUNTING``), at 600 and 3,000 rpm (10 and 50 calls a second),
the routes carrying the same ``rpm``. Each case runs one job of :data:`SECONDS` seconds'
worth of rows on a system of its own and asserts what a user of such a provider would
check: the simulator answered 200 at >= :data:`LEAST_SHARE` of the limit (its counter
sampled every 50 ms, from the first answer to the last) and 429 to at most
:data:`MOST_429` of the calls. Figures: ``ratelimit_<counting>_<rpm>_efficiency`` (200s a
second / the limit) and ``..._429_share``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from relay_batches.settings.tools import RATE_COUNTINGS
from tests.bench.harness import bench_system
from tests.bench.test_ratelimit import MAX_TOKENS, TOKENS_PER_ROW, TPM, TPM_PROMPT
from tests.helpers.paced import run_paced

SECONDS = 25
WORKERS = 3
CONCURRENCY = 16
LEAST_SHARE = 0.95
MOST_429 = 0.01


@pytest.mark.parametrize("rpm", [600, 3000])
@pytest.mark.parametrize("counting", RATE_COUNTINGS)
async def test_the_limit_holds_however_the_provider_counts(
    output_dir: Path, http: aiohttp.ClientSession, report: dict[str, Any], counting: str, rpm: int
) -> None:
    per_s = rpm / 60
    async with bench_system(
        output_dir,
        f"ratelimit-{counting}-{rpm}",
        http,
        workers=WORKERS,
        concurrency=CONCURRENCY,
        sim_env={"RELAY_SIM_RPM": str(rpm), "RELAY_SIM_RATE_COUNTING": counting},
        limits={"rpm": rpm},
    ) as bench:
        rows = int(SECONDS * per_s)
        paced = await run_paced(http, bench.system, bench.api, rows, timeout_s=4 * SECONDS)
    prefix = f"ratelimit_{counting}_{rpm}"
    report[f"{prefix}_efficiency"] = round(paced.ok_per_s / per_s, 3)
    report[f"{prefix}_429_share"] = round(paced.throttled_share, 4)
    print("\n" + paced.line(prefix, per_s))
    assert paced.completed == rows
    assert paced.ok_per_s >= LEAST_SHARE * per_s
    assert paced.throttled <= MOST_429 * paced.calls


async def test_a_token_limit_holds_over_a_sliding_second(
    output_dir: Path, http: aiohttp.ClientSession, report: dict[str, Any]
) -> None:
    """Tokens binding: 60,000 tpm (1,000 tokens in any second), rows of exactly
    :data:`TOKENS_PER_ROW` tokens as the simulator counts them (as in
    ``test_ratelimit.py``), so again 10 rows a second; the routes carry only ``tpm``."""
    per_s = TPM / 60 / TOKENS_PER_ROW
    async with bench_system(
        output_dir,
        "ratelimit-sliding-tpm",
        http,
        workers=WORKERS,
        concurrency=CONCURRENCY,
        sim_env={
            "RELAY_SIM_TPM": str(TPM),
            "RELAY_SIM_RPM": str(TPM),
            "RELAY_SIM_RATE_COUNTING": "sliding",
        },
        limits={"tpm": TPM},
    ) as bench:
        rows = int(SECONDS * per_s)
        paced = await run_paced(
            http,
            bench.system,
            bench.api,
            rows,
            timeout_s=4 * SECONDS,
            template=TPM_PROMPT,
            params={"max_tokens": MAX_TOKENS},
        )
    report["ratelimit_sliding_tpm_efficiency"] = round(paced.ok_per_s / per_s, 3)
    report["ratelimit_sliding_tpm_429_share"] = round(paced.throttled_share, 4)
    print("\n" + paced.line("ratelimit_sliding_tpm", per_s))
    assert paced.completed == rows
    assert paced.ok_per_s >= LEAST_SHARE * per_s
    assert paced.throttled <= MOST_429 * paced.calls
