"""What every chaos test runs with: the server-disruption mode and the system's settings."""

from __future__ import annotations

import os

import pytest

SERVERS_MODE = os.environ.get("RELAY_CHAOS_SERVERS", "")
if SERVERS_MODE not in {"", "restart", "sever"}:
    raise pytest.UsageError(f"RELAY_CHAOS_SERVERS must be restart or sever, got {SERVERS_MODE!r}")

# Every chaos system: two row-workers, short leases and timeouts so recovery is quick.
CHAOS_ENV = {
    "RELAY_BATCH_CONCURRENCY": "4",
    "RELAY_DISPATCH_WINDOW": "256",
    "RELAY_LEASE_SECONDS": "3",
    "RELAY_STALL_SECONDS": "20",
    "RELAY_WEBHOOK_TIMEOUT_S": "5",
    "RELAY_SCHEDULER_MAX_SLEEP_S": "5",
}
