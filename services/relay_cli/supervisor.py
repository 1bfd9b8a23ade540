"""The local supervisor behind ``make run``: every service as its own process.

It starts the children :mod:`relay_batches.services.relay_cli.dev` describes (the upstream
simulator and every service), says where each one listens, restarts a child that dies (as
Kubernetes would, with one log line saying which and why), and on SIGINT/SIGTERM stops
them all with SIGTERM, waiting for each to drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from dataclasses import dataclass, field

from relay_batches.services.relay_cli.ports import HealthPort

RESTART_PAUSE_S = 1.0
MAX_RESTART_PAUSE_S = 30.0
STABLE_RUN_S = 30.0
STOP_TIMEOUT_S = 30.0


@dataclass
class Child:
    """One supervised process: ``health`` is its health port (given to it as
    ``RELAY_HEALTH_PORT`` at every start), ``where`` what else to say it listens on."""

    name: str
    argv: list[str]
    env: dict[str, str]
    health: HealthPort | None = None
    where: str = ""
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    started_at: float = field(default=0.0)
    crash_streak: int = 0


def say(message: str) -> None:
    """One line for the person running ``make run`` (stderr, so logs stay JSON)."""
    print(f"[relay dev] {message}", file=sys.stderr, flush=True)


async def start(child: Child) -> None:
    """Start ``child``'s process and say, in one line, its pid and where it listens."""
    where = child.where
    if child.health is not None:
        port, moved = child.health.claim()
        child.env["RELAY_HEALTH_PORT"] = str(port)
        where = (
            f"health {child.health.url}"
            + (" (moved: the last port is taken)" if moved else "")
            + (f"; {child.where}" if child.where else "")
        )
    child.process = await asyncio.create_subprocess_exec(*child.argv, env=child.env)
    child.started_at = time.monotonic()
    say(f"{child.name} (pid {child.process.pid}) started" + (f"; {where}" if where else ""))


async def supervise(children: list[Child], stop: asyncio.Event) -> None:
    """Run every child, restart the ones that die, stop them all when ``stop`` is set."""
    for child in children:
        await start(child)
    watchers = {asyncio.create_task(_watch(c, stop), name=f"watch-{c.name}") for c in children}
    await stop.wait()
    say("stopping every service")
    for child in children:
        if child.process and child.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                child.process.send_signal(signal.SIGTERM)
    await _wait_all(children)
    for task in watchers:
        task.cancel()
    await asyncio.gather(*watchers, return_exceptions=True)


def exit_reason(code: int) -> str:
    """Why a child ended, from its return code (negative: killed by that signal)."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"was killed by {name}"


def restart_pause(child: Child, now: float) -> float:
    """Pause before restarting: short after a long run, doubling while it keeps crashing
    at once (Kubernetes' crash-loop back-off, in small)."""
    if now - child.started_at >= STABLE_RUN_S:
        child.crash_streak = 0
    pause = min(MAX_RESTART_PAUSE_S, RESTART_PAUSE_S * 2.0**child.crash_streak)
    child.crash_streak += 1
    return pause


async def _watch(child: Child, stop: asyncio.Event) -> None:
    while not stop.is_set():
        assert child.process is not None
        code = await child.process.wait()
        if stop.is_set():
            return
        child.restarts += 1
        pause = restart_pause(child, time.monotonic())
        say(
            f"{child.name} (pid {child.process.pid}) {exit_reason(code)}; "
            f"restarting in {pause:g}s (restart #{child.restarts})"
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), pause)
        if not stop.is_set():
            await start(child)


async def _wait_all(children: list[Child]) -> None:
    async def wait_one(child: Child) -> None:
        if child.process is None:
            return
        try:
            await asyncio.wait_for(child.process.wait(), STOP_TIMEOUT_S)
        except TimeoutError:
            say(f"{child.name} did not stop in {STOP_TIMEOUT_S:g}s; killing it")
            with contextlib.suppress(ProcessLookupError):
                child.process.kill()
            await child.process.wait()

    await asyncio.gather(*(wait_one(c) for c in children))
