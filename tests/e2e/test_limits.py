"""Input limits on the real ingest-api process: a huge body is refused before it is read."""

from __future__ import annotations

import asyncio
import zlib
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


def vm_hwm_kib(pid: int) -> int:
    """Peak resident set size of a process since its last reset, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def reset_peak(pid: int) -> None:
    """Reset a process's peak RSS (VmHWM) to its current RSS."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def gzip_of_spaces(size: int) -> bytes:
    """A gzip stream that inflates to a JSON object padded to ``size`` bytes."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [packer.compress(b'{"model":"gpt-4o-mini","requests":[]')]
    block = b" " * MIB
    for _ in range(size // MIB):
        out.append(packer.compress(block))
    out.append(packer.compress(b"}"))
    out.append(packer.flush())
    return b"".join(out)


async def test_a_small_gzip_of_a_300_mib_body_is_413_in_bounded_memory(
    system: System, api: ApiClient
) -> None:
    packed = gzip_of_spaces(300 * MIB)
    assert len(packed) < 400 * 1024
    pid = system.processes["ingest-api"].pid
    reset_peak(pid)
    status, data = await api.request(
        "POST",
        "/v1/batches",
        data=packed,
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    peak_mib = vm_hwm_kib(pid) / 1024
    print(f"ingest-api peak RSS {peak_mib:.0f} MiB for a {len(packed)} byte gzip of 300 MiB")
    assert (status, data["error"]["type"]) == (413, "request_too_large"), data
    assert peak_mib < 250, f"peak RSS {peak_mib:.0f} MiB"
