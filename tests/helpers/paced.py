"""One job through a rate-limited system, measured as the upstream sees it: how many calls
a second the simulator answered 200 while the job ran, and what share of its calls it
answered 429 (shared by the e2e and bench tests of the limiter)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from tests.helpers.processes import System, sim_stats
from tests.helpers.support import ApiClient, rows

SAMPLE_EVERY_S = 0.05
FINISHED = {"completed", "failed", "canceled", "expired"}


@dataclass(frozen=True)
class Paced:
    """One job's figures: ``ok_per_s`` is the 200s a second from the first to the last
    (the simulator's counter sampled every :data:`SAMPLE_EVERY_S`), the job's start and
    tail left out; ``seconds`` is submit to the job's end."""

    rows: int
    completed: int
    calls: int
    throttled: int
    ok_per_s: float
    seconds: float
    middle_per_s: float  # the same between the answers of 10 % and 90 % of the rows

    @property
    def throttled_share(self) -> float:
        """The share of the calls answered 429."""
        return self.throttled / max(self.calls, 1)

    def line(self, label: str, limit_per_s: float) -> str:
        """The figures as one printed line."""
        return (
            f"{label}: {self.rows} rows in {self.seconds:.1f} s, {self.ok_per_s:.2f} calls/s "
            f"= {self.ok_per_s / limit_per_s:.3f} of the limit (the middle 80 %: "
            f"{self.middle_per_s / limit_per_s:.3f}); {self.throttled} of "
            f"{self.calls} calls 429 = {self.throttled_share:.2%}"
        )


async def run_paced(
    http: aiohttp.ClientSession,
    system: System,
    api: ApiClient,
    n: int,
    *,
    timeout_s: float,
    template: str = "paced {i}",
    params: Mapping[str, Any] | None = None,
) -> Paced:
    """Submit an ``n``-row job (``params`` its parameters), wait until it ends, and
    measure it (:class:`Paced`)."""
    before = await sim_stats(http, system)
    samples: list[tuple[float, int]] = []

    async def sample() -> None:
        while True:
            ok = (await sim_stats(http, system))["ok"] - before["ok"]
            samples.append((time.monotonic(), ok))
            await asyncio.sleep(SAMPLE_EVERY_S)

    sampler = asyncio.ensure_future(sample())
    started = time.monotonic()
    try:
        job: dict[str, Any] = {"model": "gpt-4o-mini", "requests": rows(n, template)}
        if params:
            job["params"] = dict(params)
        created = await api.submit(job)
        batch: dict[str, Any] = await api.wait_status(created["id"], FINISHED, timeout=timeout_s)
        seconds = time.monotonic() - started
        await asyncio.sleep(2 * SAMPLE_EVERY_S)  # the last answers are sampled
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    after = await sim_stats(http, system)
    final = after["ok"] - before["ok"]
    # From the first sample with an answer to the first with every answer.
    t0, ok0 = next((t, ok) for t, ok in samples if ok > 0)
    t1, ok1 = next((t, ok) for t, ok in samples if ok >= final)
    m0, okm0 = next((t, ok) for t, ok in samples if ok >= 0.1 * final)
    m1, okm1 = next((t, ok) for t, ok in samples if ok >= 0.9 * final)
    return Paced(
        rows=n,
        completed=int(batch["completed"]),
        calls=after["calls"] - before["calls"],
        throttled=after["throttled"] - before["throttled"],
        ok_per_s=(ok1 - ok0) / max(t1 - t0, 1e-9),
        seconds=seconds,
        middle_per_s=(okm1 - okm0) / max(m1 - m0, 1e-9),
    )
