"""Benchmark fixtures: one HTTP session and the report every benchmark adds to."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

REPORT_PATH = Path(os.environ.get("RELAY_BENCH_REPORT", "bench-report.json"))


@pytest.fixture(scope="session")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """One HTTP client session (no connection limit)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        yield session


@pytest.fixture(scope="session")
def report() -> Iterator[dict[str, Any]]:
    """The figures of this run, written to bench-report.json at the end."""
    figures: dict[str, Any] = {}
    yield figures
    REPORT_PATH.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    print(f"\nwrote {REPORT_PATH}")
