"""The local supervisor behind ``make run``: every service as its own process.

It starts the upstream simulator and the six services, restarts a child that dies (as
Kubernetes would, with one log line saying which and why), and on SIGINT/SIGTERM stops
them all with SIGTERM, waiting for each to drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field

RESTART_PAUSE_S = 1.0
MAX_RESTART_PAUSE_S = 30.0
STABLE_RUN_S = 30.0
STOP_TIMEOUT_S = 30.0


@dataclass
class Child:
    """One supervised process."""

    name: str
    argv: list[str]
    env: dict[str, str]
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    started_at: float = field(default=0.0)
    crash_streak: int = 0


def say(message: str) -> None:
    """One line for the person running ``make run`` (stderr, so logs stay JSON)."""
    print(f"[relay dev] {message}", file=sys.stderr, flush=True)


async def start(child: Child) -> None:
    """Start ``child``'s process."""
    child.process = await asyncio.create_subprocess_exec(*child.argv, env=child.env)
    child.started_at = time.monotonic()


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
    pause = min(MAX_RESTART_PAUSE_S, RESTART_PAUSE_S * 2**child.crash_streak)
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


def child_env(base: dict[str, str], **extra: str) -> dict[str, str]:
    """The environment of a child: ours plus ``extra``."""
    env = dict(base)
    env.update(extra)
    return env


def service_children(base_env: dict[str, str], sim_port: int) -> list[Child]:
    """The simulator and the six services, each with its own health port."""
    bindir = os.path.dirname(sys.executable)

    def cmd(name: str) -> list[str]:
        return [os.path.join(bindir, f"relay-{name}")]

    children = [
        Child(
            "upstream-sim", cmd("upstream-sim"), child_env(base_env, RELAY_SIM_PORT=str(sim_port))
        )
    ]
    health_ports = {
        "ingest-api": None,
        "scheduler": 9101,
        "dispatcher": 9102,
        "row-worker": 9103,
        "aggregator": 9104,
        "notifier": 9105,
    }
    for name, port in health_ports.items():
        env = base_env if port is None else child_env(base_env, RELAY_HEALTH_PORT=str(port))
        children.append(Child(name, cmd(name), env))
    return children
