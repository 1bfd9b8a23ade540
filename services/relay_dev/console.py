"""What ``relay dev`` tells the person who ran ``make run``: the dev key kept across
restarts (``RELAY_DEV_KEY_FILE``, unless ``RELAY_DEV_API_KEY`` is set), the broker
checked before anything starts, and one ready line once every service answers."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

import aio_pika
import aiohttp

from relay_batches.reach import BROKER, reaching
from relay_batches.services.relay_cli import admin

READY_POLL_S = 0.25
PROBE_TIMEOUT_S = 2.0
BROKER_TIMEOUT_S = 10.0


def kept_key(path: Path) -> str | None:
    """The key kept in ``path`` (None when there is none, or it is unreadable)."""
    with contextlib.suppress(OSError):
        key = path.read_text(encoding="utf-8").strip()
        return key or None
    return None


def keep_key(path: Path, key: str) -> None:
    """Write ``key`` to ``path`` (its directory made), readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(key + "\n")


async def dev_key(database_url: str, workspace: str, given: str | None, key_file: Path) -> str:
    """The dev workspace's key: ``given`` (``RELAY_DEV_API_KEY``) as it is; else the one
    kept in ``key_file`` (stored again if the database is new); else a new one, then
    kept. A kept key the database refuses (another workspace's) is replaced."""
    if given is not None:
        return (await admin.create_key(database_url, workspace, given)).key
    kept = kept_key(key_file)
    created = None
    if kept is not None:
        with contextlib.suppress(admin.AdminError):
            created = await admin.create_key(database_url, workspace, kept)
    if created is None:
        created = await admin.create_key(database_url, workspace)
    if created.key != kept:
        keep_key(key_file, created.key)
    return created.key


async def check_broker(amqp_url: str) -> None:
    """Connect to RabbitMQ once and leave: :class:`~relay_batches.reach.Unreachable` if
    it cannot be reached, before any service is started."""
    async with reaching(BROKER, amqp_url):
        connection = await aio_pika.connect(amqp_url, timeout=BROKER_TIMEOUT_S)
    await connection.close()


async def _answers(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        timeout = aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)
        async with http.get(url, timeout=timeout) as response:
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def wait_ready(urls: Iterable[str], stop: asyncio.Event) -> bool:
    """Poll every URL until each has answered 200 once (True), or ``stop`` is set."""
    waiting = set(urls)
    async with aiohttp.ClientSession() as http:
        while waiting and not stop.is_set():
            answered = await asyncio.gather(*(_answers(http, url) for url in waiting))
            waiting = {url for url, ok in zip(waiting, answered, strict=True) if not ok}
            if waiting:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), READY_POLL_S)
    return not waiting


def ready_line(api_url: str, key: str) -> str:
    """``ready: API http://… · panel http://…/panel · RELAY_API_KEY=rk_…``."""
    return f"ready: API {api_url} · panel {api_url}/panel · RELAY_API_KEY={key}"
