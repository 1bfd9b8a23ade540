"""Input limits on the real ingest-api process: a huge body is refused before it is read."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.helpers.processes import System
from tests.helpers.support import ApiClient

MIB = 1024 * 1024


def rss_kib(pid: int) -> int:
    """Resident set size of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def _post_huge(port: int, key: str, size: int) -> tuple[bytes, int]:
    """POST ``size`` bytes with a Content-Length; return (status line, bytes sent)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST /v1/batches HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {size}\r\n\r\n"
    )
    writer.write(head.encode())
    chunk = b" " * MIB
    sent = 0
    try:
        while sent < size:
            writer.write(chunk)
            await asyncio.wait_for(writer.drain(), 10)
            sent += len(chunk)
    except (ConnectionError, TimeoutError):
        pass
    status = await asyncio.wait_for(reader.readline(), 10)
    writer.close()
    return status, sent


async def test_a_150_mib_body_gets_413_without_memory_growth(
    system: System, api: ApiClient
) -> None:
    pid = system.processes["ingest-api"].pid
    before = rss_kib(pid)
    status, sent = await _post_huge(system.api_port, api.key, 150 * MIB)
    after = rss_kib(pid)
    assert status.startswith(b"HTTP/1.1 413"), status
    grown_kib = after - before
    print(f"ingest-api RSS {before} KiB -> {after} KiB for a 150 MiB body")
    assert grown_kib < 8 * 1024, f"RSS grew by {grown_kib // 1024} MiB"
    assert sent > 0
